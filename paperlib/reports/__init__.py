"""Reports: figures, what notebook cells call, and notebooks executed and rendered as HTML.

- ``plots``     figures with a fixed colour per component
- ``notebook``  what the notebooks call from their cells: ``check_parameters``, ``headline``
- ``execute``   executing notebooks with papermill and rendering HTML reports; the ``report`` command
"""
