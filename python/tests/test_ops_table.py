"""ops.json is the one table of the worker's ops and error kinds; the TypeScript side checks its list against it in
test/worker/ops.test.ts. Here: the worker serves exactly the table's ops, and raises only the table's error kinds with
only their listed fields."""

import ast
from pathlib import Path

import pytest

from psyche_worker import server
from psyche_worker.server import LOOP_OPS, OPS_TABLE, Worker

PACKAGE = Path(server.__file__).parent


def test_the_worker_serves_exactly_the_tables_ops():
    w = Worker("cpu", 1)
    assert set(w.ops) | LOOP_OPS == set(OPS_TABLE["ops"])
    served = {name.removeprefix("op_") for name in dir(Worker) if name.startswith("op_")}
    assert served == set(OPS_TABLE["ops"]) - LOOP_OPS, "an op_ method the table does not list (the client cannot call it)"


def test_a_table_op_without_its_method_stops_the_worker(monkeypatch):
    monkeypatch.setitem(OPS_TABLE["ops"], "no_such_op", "listed but not served")
    with pytest.raises(RuntimeError, match="no_such_op"):
        Worker("cpu", 1)


def raised_kinds() -> list[tuple[str, str, set[str]]]:
    """(file:line, kind, field names) of every WorkerError(...) in the package, and of every error dict literal
    {"kind": ...} the server builds itself."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "WorkerError":
                keywords = {k.arg: k.value for k in node.keywords if k.arg is not None}
                kind = keywords.pop("kind", ast.Constant("bad_request"))
                assert isinstance(kind, ast.Constant), f"{where}: a WorkerError's kind must be a literal"
                found.append((where, kind.value, set(keywords)))
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "kind" and isinstance(value, ast.Constant):
                        found.append((where, value.value, set()))
    return found


def test_every_error_kind_raised_is_in_the_table_with_its_fields():
    errors = OPS_TABLE["errors"]
    kinds = raised_kinds()
    assert len(kinds) > 30 and {"bad_result", "protocol", "internal", "state"} <= {k for _, k, _ in kinds}
    for where, kind, fields in kinds:
        assert kind in errors, f"{where}: error kind {kind!r} is not in ops.json"
        assert fields <= set(errors[kind].get("fields", {})), f"{where}: {kind} carries {sorted(fields)}, ops.json lists {errors[kind].get('fields')}"
    assert "index" in errors["bad_result"]["fields"]
