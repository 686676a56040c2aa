"""config.json validation: the agent's stdlib validator and the published JSON Schema agree."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from agent.config import (
    ConfigInvalid,
    Run,
    Stage,
    compare_semver,
    is_semver,
    normalize_version,
    parse_config,
)
from tests.agent.harness import REPO
from tests.agent.jsonschema_subset import SUPPORTED, Validator, keywords

SCHEMA = json.loads((REPO / "schemas" / "package-config.v1.json").read_text())
EXAMPLE = json.loads((REPO / "examples/packages/sysctl-tuning/config.json").read_text())
BASE: dict[str, Any] = {
    "schema_version": "v1",
    "name": "demo",
    "version": "1.0.0",
    "stages": {
        "apply": {
            "steps": [{"name": "s", "path": "a.sh"}],
            "check": [{"name": "c", "path": "c.sh"}],
        }
    },
}
FULL: dict[str, Any] = {
    "schema_version": "v1",
    "name": "a1-b2",
    "version": "1.0.0-rc.1",
    "description": "everything optional is set",
    "expected_config_files": ["a.conf", "b_c-d.json"],
    "stages": {
        "apply": {
            "steps": [
                {
                    "name": "s.1",
                    "path": "dir/a.sh",
                    "args": ["env:TOKEN", "envelope", "multi\nline", ""],
                    "env": {"A_B": "x", "_c": ""},
                    "success_codes": [0, 3, 1.0],
                    "timeout_seconds": 1.5,
                    "run": "always",
                },
                {"name": "s-2", "path": "b.py", "run": "once"},
            ],
            "check": [{"name": "c", "path": "c.sh", "timeout_seconds": 86400}],
        },
        "config": {"check": [{"name": "only-a-check", "path": "c.sh"}]},
        "upgrade": {"steps": []},
        "uninstall": {
            "steps": [{"name": "u", "path": "u.sh"}],
            "check": [{"name": "c", "path": "c.sh"}],
        },
        "post-interrupt": {
            "steps": [{"name": "p", "path": "p.sh"}],
            "check": [{"name": "c", "path": "c.sh"}],
        },
    },
}


def edit(
    doc: dict[str, Any], path: str, value: Any = ..., *, delete: bool = False
) -> dict[str, Any]:
    """A copy of ``doc`` with the dotted ``path`` (list indexes as numbers) set or deleted."""
    out = copy.deepcopy(doc)
    *parents, last = path.split(".")
    node: Any = out
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if delete:
        del node[key]
    else:
        node[key] = value
    return out


STEP = "stages.apply.steps.0"
VALID = [
    pytest.param(BASE, id="minimal"),
    pytest.param(FULL, id="every-optional-field"),
    pytest.param(EXAMPLE, id="example-sysctl-tuning"),
    pytest.param(edit(FULL, "stages.apply", {"steps": []}), id="empty-steps-need-no-check"),
    pytest.param(edit(BASE, "name", "a"), id="one-letter-name"),
    pytest.param(edit(BASE, "name", "a" * 43), id="43-char-name"),
    pytest.param(edit(BASE, "version", "0.0.0"), id="zero-version"),
    pytest.param(edit(BASE, f"{STEP}.args", ["env:_X1"]), id="env-arg-underscore"),
    pytest.param(edit(BASE, f"{STEP}.path", "a" * 255), id="255-char-path"),
]
INVALID = [
    pytest.param([], id="not-an-object"),
    pytest.param(edit(BASE, "schema_version", delete=True), id="no-schema-version"),
    pytest.param(edit(BASE, "schema_version", "v2"), id="schema-v2"),
    pytest.param(edit(BASE, "name", delete=True), id="no-name"),
    pytest.param(edit(BASE, "version", delete=True), id="no-version"),
    pytest.param(edit(BASE, "stages", delete=True), id="no-stages"),
    pytest.param(edit(BASE, "descripton", "typo"), id="unknown-top-level-field"),
    pytest.param(edit(BASE, "name", "Demo"), id="name-uppercase"),
    pytest.param(edit(BASE, "name", "-demo"), id="name-leading-dash"),
    pytest.param(edit(BASE, "name", "demo-"), id="name-trailing-dash"),
    pytest.param(edit(BASE, "name", "a" * 44), id="name-44-chars"),
    pytest.param(edit(BASE, "name", ""), id="name-empty"),
    pytest.param(edit(BASE, "name", "demo\n"), id="name-trailing-newline"),
    pytest.param(edit(BASE, "name", 5), id="name-number"),
    pytest.param(edit(BASE, "version", "1.0"), id="version-two-parts"),
    pytest.param(edit(BASE, "version", "v1.0.0"), id="version-v-prefix"),
    pytest.param(edit(BASE, "version", "01.0.0"), id="version-leading-zero"),
    pytest.param(edit(BASE, "version", "1.0.0-"), id="version-empty-prerelease"),
    pytest.param(edit(BASE, "version", "1.0.0\n"), id="version-trailing-newline"),
    pytest.param(edit(BASE, "version", "1.0.0+build.1"), id="version-build-metadata"),
    pytest.param(edit(BASE, f"{STEP}.name", "s\n"), id="step-name-trailing-newline"),
    pytest.param(edit(BASE, f"{STEP}.path", "a.sh\n"), id="path-trailing-newline"),
    pytest.param(edit(BASE, "expected_config_files", ["a\n"]), id="config-file-newline"),
    pytest.param(edit(BASE, f"{STEP}.env", {"A\n": "x"}), id="env-name-newline"),
    pytest.param(edit(BASE, f"{STEP}.args", ["env:X\n"]), id="env-arg-newline"),
    pytest.param(edit(BASE, "version", "\uff11.0.0"), id="version-fullwidth-digit"),
    pytest.param(edit(BASE, "description", "x" * 1025), id="description-too-long"),
    pytest.param(edit(BASE, "description", 5), id="description-number"),
    pytest.param(edit(BASE, "expected_config_files", "a.conf"), id="config-files-not-list"),
    pytest.param(edit(BASE, "expected_config_files", ["a", "a"]), id="config-files-duplicate"),
    pytest.param(edit(BASE, "expected_config_files", ["../x"]), id="config-file-parent"),
    pytest.param(edit(BASE, "expected_config_files", [".hidden"]), id="config-file-dotfile"),
    pytest.param(edit(BASE, "expected_config_files", ["a/b"]), id="config-file-slash"),
    pytest.param(edit(BASE, "stages", {}), id="no-stage"),
    pytest.param(edit(BASE, "stages.install", {"steps": []}), id="unknown-stage"),
    pytest.param(edit(BASE, "stages.interrupt", {"steps": []}), id="interrupt-is-not-a-stage"),
    pytest.param(edit(BASE, "stages.apply", {}), id="empty-stage"),
    pytest.param(edit(BASE, "stages.apply.check", delete=True), id="steps-without-check"),
    pytest.param(edit(BASE, "stages.apply.check", []), id="steps-with-empty-check"),
    pytest.param(edit(BASE, "stages.apply.steps", {"name": "s"}), id="steps-not-list"),
    pytest.param(edit(BASE, "stages.apply.when", "now"), id="unknown-stage-field"),
    pytest.param(edit(BASE, f"{STEP}.name", delete=True), id="step-without-name"),
    pytest.param(edit(BASE, f"{STEP}.path", delete=True), id="step-without-path"),
    pytest.param(edit(BASE, f"{STEP}.idempotence", True), id="step-upstream-idempotence-field"),
    pytest.param(edit(BASE, f"{STEP}.name", "bad name"), id="step-name-space"),
    pytest.param(edit(BASE, f"{STEP}.name", "a" * 64), id="step-name-64-chars"),
    pytest.param(edit(BASE, f"{STEP}.path", "/abs.sh"), id="path-absolute"),
    pytest.param(edit(BASE, f"{STEP}.path", "../x.sh"), id="path-parent"),
    pytest.param(edit(BASE, f"{STEP}.path", "a/../b.sh"), id="path-inner-parent"),
    pytest.param(edit(BASE, f"{STEP}.path", "./a.sh"), id="path-dot"),
    pytest.param(edit(BASE, f"{STEP}.path", "a//b.sh"), id="path-double-slash"),
    pytest.param(edit(BASE, f"{STEP}.path", "a.sh/"), id="path-trailing-slash"),
    pytest.param(edit(BASE, f"{STEP}.path", "a" * 256), id="path-256-chars"),
    pytest.param(edit(BASE, f"{STEP}.args", "x"), id="args-not-list"),
    pytest.param(edit(BASE, f"{STEP}.args", [1]), id="arg-number"),
    pytest.param(edit(BASE, f"{STEP}.args", ["env:"]), id="env-arg-no-name"),
    pytest.param(edit(BASE, f"{STEP}.args", ["env:1VAR"]), id="env-arg-digit-first"),
    pytest.param(edit(BASE, f"{STEP}.args", ["env:A-B"]), id="env-arg-dash"),
    pytest.param(edit(BASE, f"{STEP}.args", ["x"] * 65), id="args-65"),
    pytest.param(edit(BASE, f"{STEP}.args", ["x" * 4097]), id="arg-too-long"),
    pytest.param(edit(BASE, f"{STEP}.env", {"1A": "x"}), id="env-bad-name"),
    pytest.param(edit(BASE, f"{STEP}.env", {"A": 1}), id="env-number-value"),
    pytest.param(edit(BASE, f"{STEP}.env", ["A=1"]), id="env-list"),
    pytest.param(edit(BASE, f"{STEP}.success_codes", []), id="codes-empty"),
    pytest.param(edit(BASE, f"{STEP}.success_codes", [256]), id="code-256"),
    pytest.param(edit(BASE, f"{STEP}.success_codes", [-1]), id="code-negative"),
    pytest.param(edit(BASE, f"{STEP}.success_codes", [0, 0]), id="codes-duplicate"),
    pytest.param(edit(BASE, f"{STEP}.success_codes", [0, 0.0]), id="codes-duplicate-float"),
    pytest.param(edit(BASE, f"{STEP}.success_codes", ["0"]), id="code-string"),
    pytest.param(edit(BASE, f"{STEP}.success_codes", [True]), id="code-bool"),
    pytest.param(edit(BASE, f"{STEP}.success_codes", [0.5]), id="code-fraction"),
    pytest.param(edit(BASE, f"{STEP}.timeout_seconds", 0), id="timeout-zero"),
    pytest.param(edit(BASE, f"{STEP}.timeout_seconds", -1), id="timeout-negative"),
    pytest.param(edit(BASE, f"{STEP}.timeout_seconds", 86401), id="timeout-too-long"),
    pytest.param(edit(BASE, f"{STEP}.timeout_seconds", "10"), id="timeout-string"),
    pytest.param(edit(BASE, f"{STEP}.timeout_seconds", True), id="timeout-bool"),
    pytest.param(edit(BASE, f"{STEP}.run", "sometimes"), id="run-unknown"),
    pytest.param(edit(BASE, "stages.apply.check.0.run", "always"), id="run-on-a-check"),
    pytest.param(edit(FULL, "stages.uninstall.steps.0.run", "always"), id="run-outside-apply"),
    pytest.param(
        edit(BASE, "stages.apply.steps", [{"name": f"s{i}", "path": "a.sh"} for i in range(65)]),
        id="65-steps",
    ),
]
# Rules JSON Schema cannot state: the schema accepts these, the agent must not.
BEYOND_SCHEMA = [
    pytest.param(
        edit(BASE, "stages.apply.check", [{"name": "s", "path": "c.sh"}]),
        "used twice",
        id="duplicate-step-name-in-stage",
    ),
    pytest.param(
        edit(BASE, "stages.apply", {"check": [{"name": "c", "path": "c.sh"}]}),
        "at least one stage must have a step",
        id="no-stage-has-a-step",
    ),
]
schema = Validator(SCHEMA)


def agent_accepts(doc: Any) -> bool:
    try:
        parse_config(doc)
    except ConfigInvalid:
        return False
    return True


def test_the_schema_uses_only_keywords_the_test_evaluator_implements() -> None:
    assert set(keywords(SCHEMA)) <= SUPPORTED
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_schema_patterns_mean_the_same_in_python_and_ecma_regex_engines() -> None:
    """``$`` also matches before a final newline in Python, so the schema must not use it."""
    patterns = re.findall(r'"pattern": ("(?:[^"\\]|\\.)*")', json.dumps(SCHEMA))
    assert len(patterns) == 7
    for raw in patterns:
        assert not re.search(r"(?<!\\)\$", json.loads(raw)), raw


@pytest.mark.parametrize("doc", VALID)
def test_valid_configs_are_accepted_by_both(doc: Any) -> None:
    assert schema.errors(doc) == []
    parse_config(doc)


@pytest.mark.parametrize("doc", INVALID)
def test_invalid_configs_are_rejected_by_both(doc: Any) -> None:
    assert schema.errors(doc) != []
    with pytest.raises(ConfigInvalid) as exc:
        parse_config(doc)
    assert all(p.startswith("$") for p in exc.value.problems), exc.value.problems


@pytest.mark.parametrize(("doc", "message"), BEYOND_SCHEMA)
def test_rules_beyond_the_schema_are_enforced_by_the_agent(doc: Any, message: str) -> None:
    assert schema.errors(doc) == []
    with pytest.raises(ConfigInvalid, match=message):
        parse_config(doc)


def _beyond_schema(doc: dict[str, Any]) -> bool:
    stages = doc["stages"].values()
    if not any(s.get("steps") for s in stages):
        return True
    for stage in stages:
        names = [s["name"] for s in (*stage.get("steps", []), *stage.get("check", []))]
        if len(names) != len(set(names)):
            return True
    return False


MUTATION_PATHS = [
    "schema_version", "name", "version", "description", "expected_config_files",
    "expected_config_files.0", "stages", "stages.apply", "stages.config", "stages.apply.steps",
    "stages.apply.check", "stages.apply.steps.0", "stages.apply.steps.0.name",
    "stages.apply.steps.0.path", "stages.apply.steps.0.args", "stages.apply.steps.0.args.0",
    "stages.apply.steps.0.env", "stages.apply.steps.0.env.A_B",
    "stages.apply.steps.0.success_codes", "stages.apply.steps.0.success_codes.0",
    "stages.apply.steps.0.timeout_seconds",
    "stages.apply.steps.0.run", "stages.apply.check.0.name", "stages.uninstall.steps.0.run",
    "stages.apply.steps.0.extra", "stages.extra", "extra",
]  # fmt: skip
EDGE_VALUES = st.one_of(
    st.sampled_from(
        ["", "v1", "v2", "a", "c", "s.1", "1.0.0", "1.0", "a.sh", "/a.sh", "../a", "env:X",
         "env:", "once", "always", "demo\n", "A", "x" * 300, "a/b", ".x"]
    ),
    st.text(max_size=8),
    st.integers(min_value=-2, max_value=300),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-5, max_value=90000),
    st.booleans(),
    st.none(),
    st.lists(st.sampled_from([0, 1, "a", "env:X", 0.0]), max_size=3),
    st.dictionaries(
        st.sampled_from(["A", "1", "name", "path"]), st.sampled_from(["x", 1]), max_size=2
    ),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(
    mutations=st.lists(
        st.tuples(st.sampled_from(MUTATION_PATHS), st.booleans(), EDGE_VALUES),
        min_size=1,
        max_size=3,
    )
)
def test_random_mutations_get_the_same_verdict_from_agent_and_schema(
    mutations: list[tuple[str, bool, Any]],
) -> None:
    doc: Any = copy.deepcopy(FULL)
    for path, delete, value in mutations:
        try:
            doc = edit(doc, path, value, delete=delete)
        except (KeyError, IndexError, TypeError, ValueError):
            continue  # the path no longer exists after an earlier mutation
    schema_ok = schema.errors(doc) == []
    expected = schema_ok and not _beyond_schema(doc)
    assert agent_accepts(doc) is expected, (doc, schema.errors(doc))


def test_the_published_schema_is_valid_and_agrees_under_a_full_implementation() -> None:
    """Cross-check of the small evaluator with a complete JSON Schema implementation."""
    jsonschema = pytest.importorskip(
        "jsonschema", reason="add jsonschema to the test extras to cross-check the schema"
    )
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    full = jsonschema.Draft202012Validator(SCHEMA)
    for param in VALID:
        assert full.is_valid(param.values[0])
    for param in INVALID:
        assert not full.is_valid(param.values[0])


def test_a_parsed_config_exposes_typed_values() -> None:
    config = parse_config(FULL)

    step = config.stages[Stage.APPLY].steps[0]
    assert step.args == ("env:TOKEN", "envelope", "multi\nline", "")
    assert step.success_codes == frozenset({0, 1, 3})
    assert step.timeout_s == 1.5
    assert step.run is Run.ALWAYS
    assert config.stages[Stage.APPLY].steps[1].run is Run.ONCE
    assert config.stages[Stage.UPGRADE].steps == ()
    assert [s.name for _, s in config.all_steps()][:3] == ["s.1", "s-2", "c"]


def test_every_problem_is_reported_at_once_with_its_path() -> None:
    doc = edit(edit(BASE, "name", "Bad"), f"{STEP}.path", "/abs")

    with pytest.raises(ConfigInvalid) as exc:
        parse_config(doc)

    assert len(exc.value.problems) == 2
    assert exc.value.problems[0].startswith("$.name:")
    assert exc.value.problems[1].startswith("$.stages.apply.steps[0].path:")


# --- semver -----------------------------------------------------------------------------

ORDERED = [
    "0.9.9", "1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta", "1.0.0-beta.2",
    "1.0.0-beta.11", "1.0.0-rc.1", "1.0.0", "1.0.1", "1.2.0", "1.10.0", "2.0.0",
]  # fmt: skip


def test_semver_precedence_follows_the_specification_examples() -> None:
    for i, lower in enumerate(ORDERED):
        for higher in ORDERED[i + 1 :]:
            assert compare_semver(lower, higher) == -1, (lower, higher)
            assert compare_semver(higher, lower) == 1, (higher, lower)
        assert compare_semver(lower, lower) == 0


@given(st.lists(st.sampled_from(ORDERED), min_size=3, max_size=3))
def test_semver_comparison_is_transitive_and_antisymmetric(versions: list[str]) -> None:
    a, b, c = versions
    assert compare_semver(a, b) == -compare_semver(b, a)
    if compare_semver(a, b) <= 0 and compare_semver(b, c) <= 0:
        assert compare_semver(a, c) <= 0


@pytest.mark.parametrize(
    ("text", "ok"),
    [("1.2.3", True), ("1.2.3-0.a", True), ("1.2.3-01", False), ("1.2", False), (" 1.2.3", False)],
)
def test_semver_syntax(text: str, ok: bool) -> None:
    assert is_semver(text) is ok


@pytest.mark.parametrize(
    ("cr_version", "normalized"),
    [
        ("1.2.3", "1.2.3"),
        ("v1.2.3", "1.2.3"),
        ("1.2", "1.2.0"),
        ("v1", "1.0.0"),
        ("1.2-rc.1", "1.2.0-rc.1"),
        ("0.0.0-alpha-1.x", "0.0.0-alpha-1.x"),
    ],
)
def test_versions_as_the_cr_spells_them_are_normalized(cr_version: str, normalized: str) -> None:
    assert normalize_version(cr_version) == normalized


@pytest.mark.parametrize("bad", ["", "v", "1.2.3.4", "01.2", "1.2.3+b", "V1.2", "1.0.0-01"])
def test_non_versions_are_refused_by_normalization(bad: str) -> None:
    with pytest.raises(ValueError, match="not a semantic version"):
        normalize_version(bad)
