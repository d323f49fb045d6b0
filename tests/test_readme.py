"""README's example under "Using it" runs as written on the CPU (issue 27: a self-contained README)."""

import os
import re

README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")


def test_readme_example_runs_on_the_cpu():
    text = open(README, encoding="utf-8").read()
    section = text[text.index("## Using it"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert not any("cuda" in line.split("#")[0] for line in code.splitlines())  # needs no GPU as written
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)
    assert tuple(scope["y"].shape) == (8, 4096) and scope["p"].shape == (4, 10)
