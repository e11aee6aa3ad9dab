"""Every script imports (so a library change cannot break one silently), without a GPU, and the
parts of them that need no device do what their usage says."""
import importlib
from pathlib import Path

import pytest

from cupy_gda import _compile, bench, chunk, recurrent
from cupy_gda._checks import Problem

SCRIPTS = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "scripts").glob("*.py")
                 if p.stem != "__init__")


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_imports(name):
    mod = importlib.import_module(f"scripts.{name}")
    assert mod.__doc__, f"scripts/{name}.py has no docstring (its usage)"


def test_sweep_shapes_grid_and_variants():
    from scripts import sweep
    assert sweep.parse_shapes("seed", ["1,2048,8,24,24", "2,64,1,16,8,bfloat16"]) == [
        ("seed", 2, 128, 4, 24, 24, "float32"), ("1,2048,8,24,24", 1, 2048, 8, 24, 24, "float32"),
        ("2,64,1,16,8,bfloat16", 2, 64, 1, 16, 8, "bfloat16")]
    grid = sweep.parse_grid("K=24,64 BH=1x8,4x16 T=128,512")
    assert len(grid) == 8 and grid[0] == ("1,128,8,24,24", 1, 128, 8, 24, 24, "float32")
    over = sweep.parse_overrides(["R=1,4", "UNROLL=2"])
    assert sweep.variants(over) == [dict(R=1, UNROLL=2), dict(R=4, UNROLL=2)]
    assert sweep.variants({}) == [{}]


def test_sweep_overrides_reach_the_config_not_the_rule():
    """recurrent.custom fixes choices and derives the rest; the rule itself is untouched."""
    p = Problem(B=2, T=128, H=4, K=24, V=24, N=2, dtype="float32", g_dtype="float32", log_gate=False)
    rule = recurrent.config(p)
    assert recurrent.custom(p) == rule
    c = recurrent.custom(p, R=4, threads=64, TC=16, P=1)
    assert (c.R, c.KT, c.BV, c.TC, c.P) == (4, 8, 8, 16, 1) and c.ASYNC_COPY == 1
    assert recurrent.custom(p, ASYNC_COPY=0).ASYNC_COPY == 0
    assert recurrent.config(p) == rule
    q = p._replace(K=64, V=64, B=4, T=2048, H=8, N=4)
    assert chunk.config(q, BV=32, P=2)[:2] == (32, 2) and chunk.config(q)[:2] == (64, 4)


def test_ncu_stages_finds_every_stage_function():
    """scripts/ncu_stages.py puts each line of gda_chunk_fwd in its numbered stage by the stage
    functions' names: every one of them is found, each stage has lines."""
    from scripts import ncu_stages
    p = Problem(B=8, T=4096, H=16, K=128, V=128, N=8, dtype="bfloat16", g_dtype="float32",
                log_gate=False)
    lines = _compile.source(chunk.FAMILY.kernel, chunk.defines(p, chunk.config(p), False),
                            chunk.FAMILY.headers).split("\n")
    cat = ncu_stages.categories(lines)
    for stage in ("1 load", "2 scores", "3 decays", "4 output", "5 state", "split", "mma",
                  "fragments", "guard", "stepped"):
        assert stage in cat, stage
    body = next(i for i, t in enumerate(lines) if "void gda_chunk_output_keys(" in t)
    assert cat[body + 1] == "4 output"


def test_baselines_register_with_the_bench_at_import():
    from scripts import baselines
    assert bench.BASELINES["textbook"] is baselines.TEXTBOOK
    assert bench.BASELINES["fla"].names == baselines.FLA_IMPLS


def test_profile_chunk_bwd_names_unknown_shapes():
    from scripts import profile_chunk_bwd
    with pytest.raises(SystemExit, match="unknown shapes.*'nope'.*known: seed"):
        profile_chunk_bwd.main(["seed,nope", "--stages"])


def test_wgmma_probe_builds_for_sm90a_without_a_gpu():
    """scripts/wgmma_probe.py (one gda_wgmma_rs a B layout, against NumPy on a Hopper GPU; the
    cluster protocol of SCAN_O_MC) builds without a GPU: a cubin with both entries, its wgmma
    not serialized by ptxas, the cluster probe's dims in it."""
    from scripts import wgmma_probe
    cubin, log = wgmma_probe.build()
    assert cubin[:4] == b"\x7fELF", log
    assert "serialized" not in log and "warning" not in log.lower(), log
    for entry in ("gda_wgmma_probe", "gda_cluster_probe"):
        assert entry.encode() in cubin, entry


def test_l2_rate_builds_for_sm90a_without_a_gpu():
    """scripts/l2_rate.py (the L2's rate into the SMs by cp.async, cp.async.bulk and clusters of
    2 multicasting, perf-notes v63) builds without a GPU, its three entries in the cubin; the
    words its check expects are each block's slot 0's last piece's first."""
    from scripts import l2_rate
    cubin, log = l2_rate.build()
    assert cubin[:4] == b"\x7fELF", log
    assert "warning" not in log.lower(), log
    for mode in l2_rate.MODES:
        assert f"gda_l2_{mode}".encode() in cubin, mode
    # 16 blocks, 10 fills of 4 slots: slot 0's last is fill 8; pieces of groups of 4 blocks
    words = l2_rate.first_words("bulk", 16, 10, 4, 4, 1000)
    assert list(words[[0, 3, 4, 15]]) == [8 * 4 * 2048, 8 * 4 * 2048, (1 + 32) * 2048, (3 + 32) * 2048]
    assert list(l2_rate.first_words("mc2", 4, 5, 8, 4, 3)[:3]) == [(4 * 2) % 3 * 2048] * 2 + [(1 + 8) % 3 * 2048]


def test_scores_parts_edits_match_the_kernel_once_and_build(monkeypatch):
    """scripts/scores_parts.py's edits of kernels/gda_chunk_bwd.cu (scores' parts left out, an
    ablation) each match exactly once in today's kernel, so the script cannot time a kernel it
    did not edit; with all of them made, GLA-1.3B's lean forward build (scores by wgmma's
    W_SPLIT) compiles for sm_90, scores within its 128 registers; an edit that matches nothing
    says which."""
    from scripts import scores_parts as sp
    text = _compile._read(sp.KERNEL)
    for parts in sp.VARIANTS.values():
        sp.edited(text, parts)
    with pytest.raises(ValueError, match="the edit 'tiles' matches 0 times"):
        sp.edited("no such kernel", ("tiles",))
    monkeypatch.setattr(_compile, "_read",
                        sp.edited_reader(_compile._read, sp.VARIANTS["loads-alone"]))
    import test_compile                                 # (tests/ is on the path: pytest's prepend)
    case = next(c for c in test_compile.CASES
                if c.id == "gda_chunk_bwd-sm_90-K256-V512-bf16-g_f32-BT64-KT64-fwd-sowg-vrows")
    kernel, arch, items = case.values
    _, res = test_compile._build(kernel, items, arch)
    assert res["functions"]["gda_chunk_bwd_scores"]["registers"] <= 128, res["log"]


def test_scores_banks_model_counts_wavefronts():
    """scripts/scores_banks.py: one warp's wavefronts (a bank's most distinct words; 8-byte
    accesses a half-warp at a time), and v51's layout of scores' b_q, b_sp, b_pr against the one
    before (1536 against 1728 a key step a block)."""
    from scripts import scores_banks as sb
    assert sb.waves(list(range(32))) == 1                   # 32 banks, one word each
    assert sb.waves([0] * 32) == 1                          # one word: a broadcast
    assert sb.waves([32 * i for i in range(32)]) == 32      # one bank, 32 words
    assert sb.waves([2 * i for i in range(32)], 2) == 2     # 8 bytes a lane: two half-warps
    new = sb.wavefronts(sb.Layout())
    old = sb.wavefronts(sb.Layout(by_column=False, pad=1))
    assert (sum(new.values()), sum(old.values())) == (1536, 1728)
    assert new["diagonal: b_q reads"] == 32 and old["diagonal: b_q reads"] == 64


def test_code_hashes_see_the_code_not_the_symbol_names(tmp_path):
    """scripts/code_hashes.py: two compiles of one build (which differ in the symbol names NVRTC
    draws afresh, in .strtab) hash the same, another arch's build not; --compare names the
    builds whose code differs and those in one map only, and exits 1 then, 0 where all agree."""
    import json
    from cupy_gda import scan
    from scripts import code_hashes
    one, two, other = (scan.FAMILY.cubin({"NT": scan.NT}, arch)[0]
                       for arch in ("sm_90", "sm_90", "sm_80"))
    assert bytes(one) != bytes(two) and code_hashes.sections(bytes(one))[".text.gda_scan_segments"]
    assert code_hashes.code_hash(one) == code_hashes.code_hash(two) != code_hashes.code_hash(other)
    old = {"a": code_hashes.code_hash(one), "b": code_hashes.code_hash(one)}
    new = {"a": code_hashes.code_hash(two), "b": code_hashes.code_hash(other), "c": "0"}
    assert code_hashes.compare(old, new) == (["b"], ["c"])
    paths = [tmp_path / "old.json", tmp_path / "new.json"]
    for path, m in zip(paths, (old, new)):
        path.write_text(json.dumps(m))
    assert code_hashes.main(["--compare", *map(str, paths)]) == 1
    assert code_hashes.main(["--compare", str(paths[0]), str(paths[0])]) == 0


def test_ncu_sass_sums_what_a_cp_async_takes():
    """scripts/ncu_sass.py: a SASS page's cp.async (LDGSTS) instructions, and only those (not the
    LDGSTSBAR arrivals), averaged per executed instruction: L2 sectors and shared wavefronts,
    each beside its ideal."""
    from scripts import ncu_sass
    cols = ["Address", "Source", "Instructions Executed", ncu_sass.SECTORS,
            ncu_sass.SECTORS + " Ideal", ncu_sass.SHARED, ncu_sass.SHARED + " Ideal"]
    rows = [["0x0", "  LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64]", "100", "1600", "1600", "400", "400"],
            ["0x10", "@!P0 LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]", "100", "3200", "1600", "3200",
             "400"],
            ["0x20", "  ARRIVES.LDGSTSBAR.64.ARVCNT [UR20]", "50", "0", "0", "0", "0"]]
    lines = ['"Kernel Name","k",', ",".join(f'"{c}"' for c in cols)]
    lines += [",".join(f'"{x}"' for x in r) for r in rows]
    text = "\n".join(ncu_sass.summary("k", ncu_sass.kernels(lines)["k"]))
    assert ("cp.async: 200 executed, a warp's each 24.0 L2 sectors (ideal 16.0), 18.0 shared "
            "wavefronts (ideal 4.0)") in text
