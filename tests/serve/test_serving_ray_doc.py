"""docs/serving.md, "Across GPUs and nodes", cannot go stale: every option of `dsl serve --ray` has its row, the
names of its Python block exist, the close code 1014 has its row, and the reason it quotes is the proxy's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytest.importorskip("ray.serve")

from duplexcadence.interpreter.cli import main as cli
from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.cluster.launch import ClusterConfig, DuplexCluster

TEXT = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text()
SECTION = TEXT[TEXT.index("## Across GPUs and nodes (Ray Serve)") :]


def test_every_ray_option_has_its_row():
    parser = cli.build_parser("serve")
    serve = next(action for action in parser._subparsers._group_actions if action.dest == "command").choices["serve"]
    group = next(group for group in serve._action_groups if group.title.startswith("across GPUs and nodes"))
    for action in group._group_actions:
        assert re.search(rf"\| `{re.escape(action.option_strings[0])}[ `]", SECTION), action.option_strings[0]


def test_the_python_block_names_what_exists():
    block = re.search(r"### From Python\n\n```\n(.*?)```", SECTION, flags=re.S).group(1)
    tree = ast.parse(block)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            module = __import__(node.module, fromlist=[alias.name for alias in node.names])
            for alias in node.names:
                assert hasattr(module, alias.name), (node.module, alias.name)
    called = {
        node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert called | used <= set(dir(DuplexCluster)) | {"ws_url"}
    for name in re.findall(r"`(\w+)`", SECTION[SECTION.index("`ClusterConfig` also takes") :].split("\n\n")[0]):
        if not name[0].isupper():  # a class: ClusterConfig, ClusterStartError
            assert name in attrs_fields(ClusterConfig), name


def attrs_fields(cls) -> set[str]:
    import attrs

    return {field.name for field in attrs.fields(cls)}


def test_the_close_code_and_the_reason_are_the_proxys():
    assert f"| {messages.CLOSE_REPLICA_LOST} |" in TEXT
    quoted = messages.replica_lost("NAME")
    assert " ".join(quoted.split()) in " ".join(SECTION.split())
    assert f"`{messages.REPLICA_LOST}`" in SECTION and f"`{messages.REPLICA_HEADER}`" in SECTION
