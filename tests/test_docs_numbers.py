"""The numbers of ``docs/beyond-the-paper.md`` are the executed notebooks' (or say where else they come from).

Each item of the page names its notebooks ("(notebook 10, ..."): every number of the item is found in their committed
outputs, as printed or rounded to the digits the page gives (a share in percent from a fraction too), unless the item
says where it comes from instead, in a comment at its end that the page does not show:

    <!-- numbers: 528 (lora_paper.yaml's grid); 0.06 (the paper's Table 6) -->

A number cited from the paper says so there. Code spans and notebook numbers are not numbers of a result. A number
no output of its notebooks holds any more (the notebook changed since the page was written) fails here; one that
another of their tables happens to print passes: this finds numbers that nothing printed, not a number read from the
wrong row.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "beyond-the-paper.md"
NUMBER = r"(?<![\w.])(?<![A-Za-z]-)\d+(?:,\d{3})*(?:\.\d+)?(?![\w])"  # 1,536; not EVA-02's 02
NOTEBOOKS = r"notebooks? (?:\d\d(?:,? and |, | or )?)+"
SOURCES = r"<!-- numbers: (.*?) -->"


def outputs(number: str) -> str:
    """The text a committed notebook printed (its outputs' plain text)."""
    notebook = json.loads(next((ROOT / "notebooks").glob(f"{number}_*.ipynb")).read_text())
    texts = []
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            texts.append("".join(output.get("text", "")))
            texts += ["".join(v) for k, v in output.get("data", {}).items() if k in ("text/plain", "text/markdown")]
    return "\n".join(texts)


def printed(number: str, values: list[float]) -> bool:
    """Whether ``number`` (as the page writes it, ``%`` aside) is one of ``values`` at the page's digits."""
    digits = len(number.split(".")[1]) if "." in number else 0
    shown = float(number.replace(",", ""))
    return any(round(value, digits) == shown or round(100 * value, digits) == shown for value in values)


def items() -> list[tuple[str, str]]:
    """The page's items: (title, text)."""
    found = re.split(r"\n(?=- \*\*)", PAGE.read_text())[1:]
    return [(re.match(r"- \*\*(.*?)\*\*", item).group(1), item) for item in found]


def unexplained(item: str) -> list[str]:
    """The numbers of ``item`` neither in its notebooks' outputs nor given a source in its comment."""
    named = sorted(set(re.findall(r"\d\d", " ".join(re.findall(NOTEBOOKS, item.split(")")[0])))))
    values = [float(v.replace(",", "")) for n in named for v in re.findall(NUMBER, outputs(n))]
    sourced = {
        source.split(" (")[0].strip() for comment in re.findall(SOURCES, item, re.S) for source in comment.split(";")
    }
    text = re.sub(SOURCES, "", item, flags=re.S)
    text = re.sub(NOTEBOOKS, "", re.sub(r"`[^`]*`", "", text))
    return [n for n in re.findall(NUMBER, text) if n not in sourced and not printed(n, values)]


@pytest.mark.parametrize("title, item", items(), ids=[title for title, _ in items()])
def test_every_number_of_an_item_is_its_notebooks_or_says_where_it_comes_from(title, item):
    assert unexplained(item) == [], title


def test_a_stale_number_is_found():
    item = "- **Equal capacity** (notebook 10): the mean tau is -0.26 (exact p = 0.6123) against -0.16 (p = 0.80)."
    assert unexplained(item) == ["0.6123"]  # 0.26, 0.16 and 0.80 are notebook 10's; 0.6123 it never printed
    assert unexplained(item + " <!-- numbers: 0.6123 (an older run) -->") == []
