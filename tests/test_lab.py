"""JupyterLab as `make lab` starts it: the server runs headless, opens a notebook's jupytext twin
as a notebook, and executes a notebook through its own kernel (not papermill)."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

from paperlib.records import paths

websocket = pytest.importorskip("websocket")  # websocket-client, a dependency of jupyter_server
pytest.importorskip("jupyterlab")

NOTEBOOKS = paths.ROOT / "notebooks"


def test_jupyter_lab_is_installed_with_jupytext():
    version = subprocess.run([sys.executable, "-m", "jupyter", "lab", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip()[0].isdigit()
    extensions = subprocess.run(
        [sys.executable, "-m", "jupyter", "labextension", "list"], capture_output=True, text=True
    )
    assert "jupytext" in extensions.stdout + extensions.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A Jupyter server on ``root``, as `make lab` starts it, without a browser."""

    def __init__(self, root: Path, home: Path):
        self.port, self.token = _free_port(), uuid.uuid4().hex
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "JUPYTER_DATA_DIR": str(home / "data")}
        env.pop("MPLBACKEND", None)  # as `make lab` starts it: figures inline, not the tests' Agg
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter",
                "server",
                "--no-browser",
                "--allow-root",  # CI and containers run as root
                f"--port={self.port}",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.root_dir={root}",
                f"--IdentityProvider.token={self.token}",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                self.get("/api/status")
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the Jupyter server did not start: {self.process.stderr.read()[-2000:]}")
                time.sleep(0.3)

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
        return json.loads(text) if text else {}

    def get(self, path: str) -> dict:
        return self.request("GET", path)

    def execute(self, kernel_id: str, sources: list[str], timeout: float = 300) -> list[dict]:
        """Run ``sources`` one after another in the kernel over its websocket; each cell's outputs
        (iopub messages) and its reply's status."""
        ws = websocket.create_connection(
            f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?token={self.token}", timeout=timeout
        )
        session, results = uuid.uuid4().hex, []
        try:
            for source in sources:
                msg_id = uuid.uuid4().hex
                header = {"msg_id": msg_id, "session": session, "username": "test", "msg_type": "execute_request"}
                content = {"code": source, "silent": False, "store_history": True, "allow_stdin": False}
                ws.send(
                    json.dumps(
                        {
                            "header": {**header, "version": "5.3"},
                            "parent_header": {},
                            "metadata": {},
                            "content": {**content, "user_expressions": {}, "stop_on_error": True},
                            "channel": "shell",
                        }
                    )
                )
                outputs, reply, idle = [], None, False
                while reply is None or not idle:
                    message = json.loads(ws.recv())
                    if message.get("parent_header", {}).get("msg_id") != msg_id:
                        continue
                    kind = message["header"]["msg_type"]
                    if message["channel"] == "shell" and kind == "execute_reply":
                        reply = message["content"]["status"]
                    elif kind == "status":
                        idle = message["content"]["execution_state"] == "idle"
                    elif kind in ("stream", "display_data", "execute_result", "error"):
                        outputs.append({"type": kind, **message["content"]})
                results.append({"status": reply, "outputs": outputs})
        finally:
            ws.close()
        return results

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def test_headless_server_opens_the_py_twin_and_executes_a_notebook(tmp_path, monkeypatch):
    monkeypatch.setenv("VIT_PLASTICITY_REPORTS", str(tmp_path / "reports"))  # the kernel's figures
    server = Server(NOTEBOOKS, tmp_path)  # root: notebooks/, as `make lab` starts it
    try:
        # jupytext's pairing: the .py twin opens as a notebook, with the .ipynb's cells
        twin = server.get("/api/contents/00_components.py?type=notebook&content=1")
        assert twin["type"] == "notebook"
        committed = nbformat.read(NOTEBOOKS / "00_components.ipynb", as_version=4)
        assert [c["source"] for c in twin["content"]["cells"]] == [c.source for c in committed.cells]

        # a notebook executed cell by cell by the server's own kernel (the project's environment)
        session = server.request(
            "POST",
            "/api/sessions",
            {"path": "00_components.ipynb", "type": "notebook", "name": "", "kernel": {"name": "python3"}},
        )
        code = [c.source for c in committed.cells if c.cell_type == "code"]
        results = server.execute(session["kernel"]["id"], ["import sys; print(sys.executable)"] + code)
        assert [r["status"] for r in results] == ["ok"] * len(results), [
            o for r in results for o in r["outputs"] if o["type"] == "error"
        ]
        assert Path(results[0]["outputs"][0]["text"].strip()).resolve() == Path(sys.executable).resolve()
        texts = "".join(o.get("text", "") for r in results for o in r["outputs"])
        assert "vit_base_in21k: vit_base_patch16_224.orig_in21k, 85,806,346 parameters" in texts
        assert any("image/png" in o.get("data", {}) for r in results for o in r["outputs"])
        server.request("DELETE", f"/api/sessions/{session['id']}")
    finally:
        server.stop()
    assert server.process.returncode is not None
