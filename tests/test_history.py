"""``pagedprefix history vllm``: the wheel cache, the release loader's stand-ins, the notes, the
document and its ``--check``, the command's user errors. (The releases themselves are judged by
``nox -s history``, which downloads them.)"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import types
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pagedprefix.conformance.reporting import history, history_fetch, history_notes
from pagedprefix.conformance.reporting.history import ReleaseResult
from pagedprefix.conformance.running.shapes import Shape
from typer.testing import CliRunner


def test_version_order_and_form() -> None:
    versions = ["0.10.1.1", "0.6.6.post1", "0.10.1", "0.9.0", "0.6.6", "0.33.0", "0.10.0"]
    assert sorted(versions, key=history_fetch.version_key) == [
        "0.6.6",
        "0.6.6.post1",
        "0.9.0",
        "0.10.0",
        "0.10.1",
        "0.10.1.1",
        "0.33.0",
    ]
    assert history_fetch.FINAL.fullmatch("0.8.5.post1")
    for bad in ("0.11.0rc1", "latest", "0.9", "0.9.0.dev3"):
        assert not (history_fetch.FINAL.fullmatch(bad) and len(bad.split(".")) >= 3), bad
    with pytest.raises(ValueError):
        history_fetch.version_key("0.11.0rc1")


def _fake_wheel(directory: Path, version: str) -> bytes:
    path = directory / f"vllm-{version}-cp38-abi3-manylinux1_x86_64.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("vllm/__init__.py", "")
        z.writestr("vllm/_version.py", f"__version__ = version = '{version}'\n")
        z.writestr("vllm/v1/core/kv_cache_manager.py", "X = 1\n")
        z.writestr("vllm/_C.abi3.so", b"\x7fELF")
        z.writestr(f"vllm-{version}.dist-info/METADATA", "Name: vllm\n")
    return path.read_bytes()


def test_fetch_keeps_only_pure_python_and_records_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[list[str]] = []
    made: dict[str, bytes] = {}

    def fake_run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        made["wheel"] = _fake_wheel(Path(cmd[cmd.index("-d") + 1]), "0.7.3")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(history_fetch.subprocess, "run", fake_run)
    got = history_fetch.fetch(tmp_path, "0.7.3")
    assert "--no-deps" in calls[0] and "vllm==0.7.3" in calls[0]
    assert got.sha256 == hashlib.sha256(made["wheel"]).hexdigest() and got.bytes == len(made["wheel"])
    files = sorted(str(p.relative_to(got.root)) for p in got.root.rglob("*") if p.is_file())
    assert files == ["vllm/__init__.py", "vllm/_version.py", "vllm/v1/core/kv_cache_manager.py", "wheel.json"]
    assert not list(tmp_path.rglob("*.whl"))  # the wheel is deleted after extraction
    # Cached: the second call does not download.
    assert history_fetch.fetch(tmp_path, "0.7.3") == got and len(calls) == 1


def test_fetch_without_a_wheel_is_a_fetch_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(
            cmd, 1, "", "ERROR: No matching distribution found for vllm==0.6.7"
        )

    monkeypatch.setattr(history_fetch.subprocess, "run", fake_run)
    with pytest.raises(history_fetch.FetchError, match="No matching distribution"):
        history_fetch.fetch(tmp_path, "0.6.7")
    assert not (tmp_path / "0.6.7").exists()
    result = history.drive("0.6.7", tmp_path)
    assert result.verdict == "not driven" and "no wheel" in result.reason


LOADER_PROBE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from pagedprefix.conformance.engines import _release
    from pagedprefix.conformance.engines._harness import StandInUsed
    r = _release.load_release(Path(sys.argv[1]), ["vllm.cache"])
    cache = r.modules["vllm.cache"]
    out = {"version": r.version, "value": cache.VALUE, "stood_in": sorted(r.stood_in),
           "cache_real": not _release.is_stood_in(cache)}
    try:
        cache.use_heavy()
    except StandInUsed as e:
        out["heavy"] = str(e)
    print(json.dumps(out))
    """
)


def test_release_loader_stands_in_only_for_what_fails(tmp_path: Path) -> None:
    """A fake release: ``vllm.heavy`` imports a package that is not installed; the cache module
    imports one pure definition and one that needs the missing package. The cache module is real,
    the pure definition is the release's own, the other raises when used."""
    pkg = tmp_path / "vllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import pagedprefix_not_installed_xyz\n")
    (pkg / "_version.py").write_text("__version__ = version = '0.7.9'\n")
    (pkg / "heavy.py").write_text(
        "import pagedprefix_not_installed_xyz as np2\n"
        "def cdiv(a, b):\n    return -(-a // b)\n"
        "class Engine(np2.Base):\n    pass\n"
    )
    (pkg / "cache.py").write_text(
        "from vllm.heavy import cdiv, Engine\nVALUE = cdiv(7, 2)\ndef use_heavy():\n    return Engine()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", LOADER_PROBE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["version"] == "0.7.9" and got["value"] == 4 and got["cache_real"]
    assert got["stood_in"] == ["vllm", "vllm.heavy"]
    assert "vllm.heavy.Engine is a harness placeholder" in got["heavy"]


LORA_ID = Shape("allocate", "hit-other-content", ("lora.id",))
LORA_VS_SALT = Shape("lookup", "hit-more", ("lora.name", "lora.id", "cache_salt"))


def test_notes_cite_the_line_of_that_release(tmp_path: Path) -> None:
    f = tmp_path / "vllm" / "v1" / "core" / "kv_cache_utils.py"
    f.parent.mkdir(parents=True)
    f.write_text(
        "def a():\n    pass\ndef _gen_lora_extra_hash_keys(request):\n"
        "    return [request.lora_request.lora_name]\n"
    )
    name, text, refs = history_notes.explain("0.17.0", LORA_ID, tmp_path)
    assert name == "lora-by-name"
    assert "`vllm/v1/core/kv_cache_utils.py` line 4" in text and any("30931" in r for r in refs)
    # 0.31.0 keys by name and path: the note does not cover it, a failure there is unexplained.
    assert history_notes.explain("0.31.0", LORA_ID, tmp_path) == ("", "*unexplained*", [])


def test_notes_are_matched_by_shape_not_by_property() -> None:
    """Two published bugs that fail one property (`hit-content`) on one release get their own
    notes: a LoRA keyed by name alone (only the adapter id differs) and LoRA and salt keyed as bare
    strings (a LoRA "x" against a salt "x": name, id and salt differ)."""
    assert history_notes.explain("0.20.0", LORA_ID)[0] == "lora-by-name"
    name, _, refs = history_notes.explain("0.20.0", LORA_VS_SALT)
    assert name == "untagged-extra-keys" and any("44701" in r for r in refs)
    # A shape no note describes is unexplained, whatever property it fails.
    salt_only = Shape("allocate", "hit-other-content", ("cache_salt",))
    assert history_notes.explain("0.20.0", salt_only) == ("", "*unexplained*", [])
    refused = Shape("allocate", "refused-but-changed")
    assert history_notes.explain("0.6.6", refused)[0] == "touch-before-check"
    assert history_notes.explain("0.7.0", refused)[0] == ""  # fixed in 0.7.0


def _case(
    prop: str, shape: Shape, note: str = "", explanation: str = "*unexplained*", case: str = "stateful"
) -> dict[str, Any]:
    return {
        "id": case, "property": prop, "message": "m", "shape": shape.to_json(),
        "note": note, "explanation": explanation, "references": ["u"] if note else [],
    }


def _results() -> list[ReleaseResult]:
    refused = Shape("allocate", "refused-but-changed")
    fail = {
        "name": "atomic-failure",
        "kind": "property",
        "status": "fail",
        "detail": "changed ref_cnt",
        "counterexample": "1. allocate(1, [1, 2])",
        "cases": [_case("atomic-failure", refused, "touch", "a bug")],
    }
    skipped = [{"name": "capability: fork", "reason": "not declared: fork and copy-on-write not exercised"}]
    channels = [
        {"name": "prompt_token_ids", "driven": True, "reached": 10, "reason": "tokens"},
        {"name": "mm_features", "driven": False, "reached": 0, "reason": "not yet"},
    ]
    return [
        ReleaseResult("0.6.5", "FAIL", "exact", [fail], {"reset": 0}, "", "w", "ab", 0, skipped, channels),
        ReleaseResult("0.7.0", "PASS", "exact", [], {"reset": True}, "", "w", "cd", 0, skipped, channels),
        ReleaseResult("0.7.1", "not driven", reason="no wheel: none"),
    ]


def test_document_rows_and_check() -> None:
    results = _results()
    text = history.render_markdown(results)
    assert "| 0.6.5 | FAIL | single FAIL | `atomic-failure` | a bug | `fork`, `channel mm_features` |" in text
    assert "| 0.7.0 | PASS | single pass | - | - | `fork`, `channel mm_features` |" in text
    assert "| 0.7.1 | not driven | - | - | not driven: no wheel: none | - |" in text
    assert "1. allocate(1, [1, 2])" in text
    assert "- `mm_features`: not driven: not yet" in text
    assert "- `prompt_token_ids`: driven, reached by 10 requests: tokens" in text
    assert "- `capability: fork`: not declared: fork and copy-on-write not exercised" in text
    assert history.check(results, text) == []
    assert history.check(results[1:2], text) == []  # a subset is compared release by release
    changed = [ReleaseResult("0.7.0", "FAIL", "exact", [dict(results[0].failing[0])], {"reset": True})]
    [problem] = history.check(changed, text)
    assert problem.startswith("0.7.0: row")
    new = [ReleaseResult("0.8.0", "PASS", "exact")]
    assert history.check(new, text) == ["0.8.0: not in the committed history"]


def test_families_column_says_which_family_fails() -> None:
    """A release with events and hybrid groups: a case whose config has hybrid groups is the hybrid
    family's (whatever its property), an ``event-*`` case of one group the events family's."""
    hybrid = Shape("allocate", "event-tokens", (), ("full(4)", "sliding(6,4)"))
    events = Shape("allocate", "event-alike", ("cache_salt",))
    failing = [
        {"name": "event-index", "cases": [_case("event-index", hybrid, "", "")]},
        {"name": "vectors: extras", "cases": [
            {**_case("event-extras", events, "", ""), "id": "extras/salt-vs-none/b2"},
        ]},
    ]
    caps = {"events": True, "groups": ["chunked", "full", "sliding"]}
    r = ReleaseResult("0.30.0", "FAIL", "exact", failing, caps)
    assert history.family_verdicts(r) == "single pass, events FAIL, hybrid FAIL"
    assert history.family_verdicts(replace(r, failing=[])) == "single pass, events pass, hybrid pass"
    assert history.family_verdicts(replace(r, capabilities={"events": False, "groups": []})) == "single pass"
    assert history.family_verdicts(replace(r, verdict="INCOMPLETE")) == "-"


def test_every_failing_case_is_listed_under_its_own_explanation() -> None:
    """A row that fails one property with two bugs lists both, each with its cases; an unexplained
    shape is shown as such, apart from the explained ones."""
    extras = {
        "name": "vectors: extras", "kind": "vectors", "status": "fail", "detail": "2 failed",
        "counterexample": "first only",
        "cases": [
            _case("hit-content", LORA_ID, "lora-by-name", "keyed by name", "extras/lora-id-matters/b2"),
            _case("hit-content", LORA_VS_SALT, "untagged-extra-keys", "bare strings",
                  "extras/lora-x-vs-salt-x/b2"),
            _case("hit-content", Shape("allocate", "hit-other-content", ("mm",)), case="extras/mm-offset/b2"),
        ],
    }
    r = ReleaseResult("0.20.0", "FAIL", "exact", [extras])
    found = history.findings(r)
    assert [(f.note, list(f.rows.values())) for f in found] == [
        ("lora-by-name", [["extras/lora-id-matters/b2"]]),
        ("untagged-extra-keys", [["extras/lora-x-vs-salt-x/b2"]]),
        ("", [["extras/mm-offset/b2"]]),
    ]
    row = history.render_row(r)
    assert "keyed by name" in row and "bare strings" in row
    assert "*unexplained*: `vectors: extras` (allocate, hit-other-content, extras differ in mm)" in row
    section = "\n".join(history.render_section(r))
    assert "First case: extras/lora-x-vs-salt-x/b2: [hit-content] m" in section


def test_check_fails_when_a_driven_channel_was_never_reached() -> None:
    """A broken adapter that declares a channel driven but never sends it is caught by --check."""
    results = _results()
    text = history.render_markdown(results)
    results[1].channels = [{"name": "cache_salt", "driven": True, "reached": 0, "reason": "salt"}]
    problems = history.check(results[1:2], text)
    assert "0.7.0: channel cache_salt is declared driven but no request reached it" in problems


def test_not_judged_lists_skip_rows_and_skipped_vector_cases() -> None:
    from pagedprefix.conformance.running.suite import CheckResult

    rows = [
        CheckResult("hit-content", "property", "pass"),
        CheckResult("event-index", "property", "skip", "capability events not declared"),
        CheckResult("vectors: extras", "vectors", "pass", "4 passed, 22 skipped (needs mm: 12; needs x: 10)"),
        CheckResult("vectors: cow", "vectors", "pass", "3 passed"),
    ]
    assert history.not_judged(rows) == [
        {"name": "event-index", "reason": "capability events not declared"},
        {"name": "vectors: extras", "reason": "22 skipped (needs mm: 12; needs x: 10)"},
    ]


def _cli(*args: str) -> Any:
    from pagedprefix.cli import _register, app

    _register()
    return CliRunner().invoke(app, ["history", *args])


@pytest.mark.parametrize(
    "args, message",
    [
        (["sglang"], "only vllm"),
        (["vllm", "--release", "0.5.0"], "starts at 0.6.5"),
        (["vllm", "--release", "latest"], "not a release number"),
        (["vllm", "--jobs", "0"], "--jobs"),
        (["vllm", "--ci", "--release", "0.7.0"], "exclude"),
        (["vllm", "--check", "--out", "no/such/HISTORY.md"], "does not exist"),
    ],
)
def test_cli_user_errors(args: list[str], message: str) -> None:
    result = _cli(*args)
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output


def test_committed_history_covers_every_release() -> None:
    """docs/HISTORY.md has a row for every release from 0.6.5 to 0.33.0, none unexplained."""
    text = (Path(__file__).parent.parent / "docs" / "HISTORY.md").read_text(encoding="utf-8")
    parsed = history.parse_markdown(text)
    assert {"0.6.5", "0.10.1", "0.33.0"} <= parsed.keys()
    for version, (row, _) in parsed.items():
        assert row, version
        assert "*unexplained*" not in row, row


def test_free_order_is_read_from_the_free_path() -> None:
    from pagedprefix.conformance.engines.vllm_release import _free_order

    separating = (
        "for block in ordered_blocks:\n    if block.block_hash is None:\n        without.append(block)\n"
        "self.free_block_queue.prepend_n(without)\nself.free_block_queue.append_n(with_hash)\n"
    )
    assert _free_order(separating) == "unhashed_to_head"
    # 0.23.0: free_blocks takes a prepend parameter that its full-attention path never sets.
    parameter_only = "if prepend:\n    self.free_block_queue.prepend_n(freed)\nelse:\n    q.append_n(freed)\n"
    assert _free_order(parameter_only) == "append_all"
    assert _free_order("self.free_block_queue.append(block)\n") == "append_all"


def test_a_partial_run_keeps_the_other_releases(tmp_path: Path) -> None:
    from pagedprefix.conformance.history_cli import _merge

    old = tmp_path / "HISTORY.json"
    old.write_text(json.dumps(history.to_json(_results())), encoding="utf-8")
    merged = _merge(old, [ReleaseResult("0.7.0", "FAIL", "exact", [], {}), ReleaseResult("0.8.0", "PASS")])
    assert [(r.version, r.verdict) for r in merged] == [
        ("0.6.5", "FAIL"), ("0.7.0", "FAIL"), ("0.7.1", "not driven"), ("0.8.0", "PASS"),
    ]
    assert merged[0].failing[0]["counterexample"] == "1. allocate(1, [1, 2])"


def test_release_channels_follow_the_release_code() -> None:
    """The channel inventory comes from what the release's code has: multimodal items are driven
    where the key reads them; where it does not, the row says why no multimodal request is cached
    (the engine's own switch), or marks it unexplained."""
    from pagedprefix.conformance.engines.vllm_release import (
        ReleaseInfo,
        release_capabilities,
        release_channels,
    )

    base = ReleaseInfo("0.6.5", False, False, {"sha256": "builtin"}, "builtin", "", False, False, False,
                       "append_all", True, lora_input=True, mm_caching_off=True)
    channels = {c.name: c for c in release_channels(base)}
    mm = channels["multi_modal_data"]
    assert not mm.driven and "turns prefix caching off" in mm.reason
    assert not channels["lora_request"].driven and "0.7.3" in channels["lora_request"].reason
    caps = release_capabilities(base)
    assert "mm" not in caps.extras and not caps.mm_placeholders
    silent = {c.name: c for c in release_channels(replace(base, mm_caching_off=False))}
    assert "*unexplained*" in silent["multi_modal_data"].reason
    later = replace(base, version="0.7.0", mm_input="multi_modal_hashes", cache_salt=True)
    channels = {c.name: c for c in release_channels(later)}
    assert channels["multi_modal_hashes"].driven and channels["multi_modal_hashes"].spec_extra_kind == "mm"
    assert channels["cache_salt"].driven and "multi_modal_data" not in channels
    caps = release_capabilities(later)
    assert {"mm", "cache_salt"} <= caps.extras and caps.mm_placeholders


def test_whole_prompt_embeddings_are_driven_where_the_key_reads_them() -> None:
    """0.11.1 to 0.20.2 key prompt embeddings but take them for a whole prompt only: the channel is
    driven in the whole form (``embeds_whole``); 0.21.0 on, the mixed form; 0.11.0 (no key field)
    says why not."""
    from pagedprefix.conformance.engines.vllm_release import (
        ReleaseInfo,
        release_capabilities,
        release_channels,
    )

    base = ReleaseInfo("0.11.0", True, True, {"sha256": "sha256"}, "sha256", "id", True, True, False,
                       "append_all", False, prompt_embeds=True)
    assert not base.embeds_whole and "prompt_embeds" not in release_capabilities(base).extras
    assert not {c.name: c for c in release_channels(base)}["prompt_embeds"].driven
    whole = replace(base, version="0.15.0", embeds_keyed=True)
    caps = release_capabilities(whole)
    assert whole.embeds_whole and caps.embeds_whole and caps.embeds_placeholders
    assert "prompt_embeds" in caps.extras
    channel = {c.name: c for c in release_channels(whole)}["prompt_embeds"]
    assert channel.driven and channel.engine_input == "Request(prompt_token_ids=None, prompt_embeds=tensor)"
    mixed = replace(whole, version="0.21.0", embeds_mixed=True)
    caps = release_capabilities(mixed)
    assert not mixed.embeds_whole and not caps.embeds_whole and caps.embeds_placeholders


def test_release_groups_follow_the_release_code() -> None:
    """Hybrid groups (issue 34 part 4) are declared where the release has its coordinator, with the
    retention it can follow: none before its knob (every tail kept: the spec's ``dense``), the
    config's through ``$VLLM_PREFIX_CACHE_RETENTION_INTERVAL`` or ``KVCacheConfig``; events stay
    off in hybrid configs where the release's engine turns the hybrid manager off for them."""
    from pagedprefix.conformance.engines.vllm_release import (
        HYBRID_EVENTS_OFF,
        ReleaseInfo,
        release_capabilities,
        release_channels,
    )
    from pagedprefix.conformance.protocol.channels import GROUPS

    before = ReleaseInfo("0.8.5", True, False, {"sha256": "sha256"}, "sha256", "", False, True, False,
                         "append_all", False)
    assert release_capabilities(before).groups == frozenset()
    assert "kv_cache_groups" not in {c.name for c in release_channels(before)}
    first = replace(before, version="0.9.1", groups=frozenset({"full", "sliding"}), events=True)
    caps = release_capabilities(first)
    assert caps.groups == {"full", "sliding"} and caps.retention == "dense"
    channels = {c.name: c for c in release_channels(first)}
    groups = channels["kv_cache_groups"]
    assert groups.driven and groups.reach == GROUPS and "`SlidingWindowSpec`" in groups.reason
    assert "ChunkedLocalAttentionSpec" not in groups.reason and "retention_interval" not in channels
    assert HYBRID_EVENTS_OFF in groups.reason and "MambaSpec" in groups.reason
    later = replace(first, version="0.30.0", groups=frozenset({"full", "sliding", "chunked"}),
                    retention="config", hybrid_events=True)
    assert release_capabilities(later).retention == "replay"
    channels = {c.name: c for c in release_channels(later)}
    assert "ChunkedLocalAttentionSpec" in channels["kv_cache_groups"].reason
    assert HYBRID_EVENTS_OFF not in channels["kv_cache_groups"].reason
    assert channels["retention_interval"].engine_input == "KVCacheConfig.prefix_cache_retention_interval"
    env = {c.name: c for c in release_channels(replace(later, retention="env"))}
    assert "VLLM_PREFIX_CACHE_RETENTION_INTERVAL" in env["retention_interval"].engine_input


class _Pool:
    queue: Any = None

    def free_blocks(self, blocks: list[object], prepend: bool = False) -> None:
        """Appends ``blocks``, or prepends them where the caller asks (0.23.0's signature)."""
        if prepend:
            self.queue.prepend_n(blocks)
        else:
            self.queue.append_n(blocks)


class _Window:
    def free(self, blocks: list[object]) -> None:
        """0.23.0's own free path of a window group: blocks without a hash go to the head."""
        cached = [b for b in blocks if b.block_hash is not None]  # type: ignore[attr-defined]
        uncached = [b for b in blocks if b.block_hash is None]  # type: ignore[attr-defined]
        _Pool().free_blocks(cached)
        _Pool().free_blocks(uncached, prepend=True)


class _Plain:
    def free(self, blocks: list[object]) -> None:
        _Pool().free_blocks(blocks)


def test_window_free_order_is_read_from_the_window_group_free_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.23.0's sliding-window manager frees blocks without a hash to the head while its full groups
    append all: read from the window manager's own free path, so a hybrid config declares ``other``."""
    from pagedprefix.conformance.engines import vllm_release

    pool = types.SimpleNamespace(BlockPool=_Pool)
    for window, want in ((_Window, "unhashed_to_head"), (_Plain, "append_all")):
        single = types.SimpleNamespace(SlidingWindowManager=window)
        monkeypatch.setitem(sys.modules, "vllm.v1.core.single_type_kv_cache_manager", single)
        assert vllm_release._window_free_order({"vllm.v1.core.block_pool": pool}) == want  # type: ignore[dict-item]
    assert vllm_release._window_free_order({}) == ""


def test_window_of_one_and_sparse_events_are_told_apart_by_their_groups() -> None:
    """The hybrid notes match on the config's groups as written: a lost hit with a one-token
    window is the documented difference, the same lost hit with a wider window is unexplained; a
    run with more tokens than keys is the sparse-event bug only with a sliding or chunked group."""
    from pagedprefix.conformance.reporting.history_notes import NOTES

    def names(version: str, shape: Shape) -> list[str]:
        return [n.name for n in NOTES if n.covers(version, shape)]

    one = Shape("lookup", "hit-less", (), ("sliding(1,2)",))
    assert names("0.20.0", one) == ["sliding-window-of-one"]
    assert names("0.9.0", one) == []  # no coordinator yet: no hybrid run to explain
    assert names("0.20.0", Shape("lookup", "hit-less", (), ("sliding(3,2)",))) == []
    refused = Shape("allocate", "refused-spec-succeeds", (), ("full(2)", "sliding(1,2)"))
    assert names("0.12.0", refused) == ["sliding-window-of-one"]
    sparse = Shape("allocate", "event-tokens", (), ("full(4)", "sliding(6,4)"))
    assert names("0.30.0", sparse) == ["events-sparse-token-ids"]
    assert names("0.30.0", Shape("allocate", "event-tokens")) == []
    crash = Shape("append", "crashed", (), (), "AttributeError")
    assert names("0.10.1", crash) == ["events-lora-id-crash"]
    assert names("0.10.1", replace(crash, raised="AssertionError")) == []


def _utils(tmp_path: Path, name: str, source: str, **attrs: object) -> types.SimpleNamespace:
    f = tmp_path / name / "kv_cache_utils.py"
    f.parent.mkdir(parents=True)
    f.write_text(source, encoding="utf-8")
    return types.SimpleNamespace(__file__=str(f), **attrs)


def test_seed_promises_are_read_from_the_release_code(tmp_path: Path) -> None:
    """Each era of vLLM's root key, as its own source states it (issue 34 part 2): the suite judges
    only the halves a release promises, and says where the promise comes from."""
    from pagedprefix.conformance.engines.vllm import seed_declaration

    def xxhash(data: object) -> bytes:
        return b""

    def sha256(data: object) -> bytes:
        return b""

    resolve = _utils(tmp_path, "r", "def resolve_none_hash_seed(f): ...\n",
                     resolve_none_hash_seed=object(), _NON_CRYPTO_HASH_FUNCTIONS=frozenset({xxhash}))
    assert [seed_declaration(resolve, f)["seed_unpinned"] for f in (sha256, xxhash)] == ["equal", "differ"]
    assert seed_declaration(resolve, sha256)["seed_pinned"] == "equal"
    src = "NONE_HASH = os.urandom(32) if os.getenv('PYTHONHASHSEED') is None else 1\n"
    urandom = _utils(tmp_path, "u", src)
    assert [seed_declaration(urandom, None)[k] for k in ("seed_env", "seed_pinned", "seed_unpinned")] == [
        "PYTHONHASHSEED", "equal", "differ"]
    string_root = _utils(tmp_path, "s", "        parent_block_hash = hash('None')\n")
    got = seed_declaration(string_root, None)
    assert (got["seed_pinned"], got["seed_unpinned"]) == ("unpromised", "differ")
    none_root = _utils(tmp_path, "n", "    return hash((parent_block_hash, tokens))\n")
    got = seed_declaration(none_root, None)
    assert got["seed_env"] is None and "12621" in got["seed_source"]


def test_opaque_keys_of_every_era() -> None:
    from collections import namedtuple

    from pagedprefix.conformance.engines.vllm import opaque_key

    BlockHashType = namedtuple("BlockHashType", "hash_value token_ids extra_keys")
    BlockHashWithGroupId = namedtuple("BlockHashWithGroupId", "block_hash group_id")
    assert opaque_key(BlockHashWithGroupId(BlockHashType(-5, (1, 2), None), 0)) == "-5"
    assert opaque_key(b"\x01\xff") == "01ff" and opaque_key(7) == "7"
    with pytest.raises(ValueError, match="not a cached block's hash"):
        opaque_key(None)


def test_documents_quote_tracebacks_without_the_writers_paths() -> None:
    from pagedprefix.conformance.reporting.portable import portable, portable_json

    trace = (
        'Traceback (most recent call last):\n'
        '  File "/home/me/src/pagedprefix/conformance/judging/driver.py", line 179, in execute\n'
        '  File "/home/me/.cache/pagedprefix/vllm/0.9.0/vllm/v1/core/block_pool.py", line 182, in x\n'
        '  File "/usr/lib/python3.11/json/decoder.py", line 3, in y\n'
        '  File "<string>", line 1, in <module>\n'
    )
    assert portable(trace).splitlines()[1:] == [
        '  File "conformance/judging/driver.py", line 179, in execute',
        '  File "vllm/v1/core/block_pool.py", line 182, in x',
        '  File "json/decoder.py", line 3, in y',
        '  File "<string>", line 1, in <module>',
    ]
    assert portable_json({"a": [trace], "n": 3})["a"][0] == portable(trace)


def test_events_of_every_release_era_map_onto_the_spec_events() -> None:
    """A release's own event objects (fields as each era's ``kv_events.py`` has them) and keys (a
    signed ``hash()``, a 256-bit SHA-256 int, 64-bit ints, bytes) as the spec's events."""
    from dataclasses import dataclass as dc

    from pagedprefix.conformance.engines.vllm import spec_event
    from pagedprefix.conformance.engines.vllm_release import release_key
    from pagedprefix.spec.events import BlockRemoved, BlockStored
    from pagedprefix.spec.extras import TAG_LORA

    @dc
    class OldStored:  # 0.9 to 0.13: no extra_keys, no lora_name, no group_idx
        block_hashes: list[int]
        parent_block_hash: int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None

    @dc
    class NewStored(OldStored):  # 0.17 on
        lora_name: str | None = None
        extra_keys: list[tuple[object, ...] | None] | None = None
        group_idx: int = 0

    BlockStoredOld = type("BlockStored", (OldStored,), {})
    BlockStoredNew = type("BlockStored", (NewStored,), {})
    old = spec_event(BlockStoredOld([-5, 2**255], None, [1, 2, 3, 4], 2, 7), release_key)
    assert isinstance(old, BlockStored) and old.block_hashes == (release_key(-5), release_key(2**255))
    assert [f.payload for f in old.extras[0]] == [b"lora_id:7"] and len(old.extras) == 2
    new = spec_event(BlockStoredNew([1], 9, [5, 6], 2, 3, "ad", [("salt",)], 1), release_key)
    assert isinstance(new, BlockStored) and new.group == 1 and new.parent_block_hash == release_key(9)
    assert [(f.tag, f.payload) for f in new.extras[0]] == [(TAG_LORA, b"ad"), (0, b"salt")]
    removed = type("BlockRemoved", (), {"block_hashes": [b"\x01" * 8]})()
    assert spec_event(removed, release_key) == BlockRemoved((b"\x01" * 8,), 0)
    assert release_key(-1) != release_key(2**64 - 1) and len(release_key(3)) == 8
    with pytest.raises(TypeError, match="neither an int nor bytes"):
        release_key("3")
