import itertools

import pytest

from gluon_survey.driver.shapes import (
    DENSE_M,
    GroupedShape,
    Shape,
    fixed_layouts,
    grid,
    holdout_shapes,
    llm_dense_shapes,
    llm_shapes,
    llm_train_shapes,
    moe_shapes,
    parse_dim,
    read_csv,
    resolve,
    routing_counts,
    shape_of,
)


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("8192", [8192]),
        ("512,1024", [512, 1024]),
        ("512:2048:512", [512, 1024, 1536, 2048]),  # inclusive stop, as in CUTLASS
        ("512:2000:512", [512, 1024, 1536]),
        ("1, 16,128:512:128", [1, 16, 128, 256, 384, 512]),
        ("64,64:128:64", [64, 128]),  # duplicates dropped, order kept
    ],
)
def test_parse_dim(spec, sizes):
    assert parse_dim(spec, "k") == sizes


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("abc", "'abc' is not an integer"),
        ("0", "must be at least 1"),
        ("-4", "must be at least 1"),
        ("1:2:3:4", "a size, a start:stop (doubling) or a start:stop:step range"),
        ("2048:512:512", "stops (512) before it starts (2048)"),
        ("512:1024:0", "must be at least 1"),
        (",", "no sizes"),
    ],
)
def test_parse_dim_errors_name_the_option(spec, message):
    with pytest.raises(ValueError, match="--k") as err:
        parse_dim(spec, "k")
    assert message in str(err.value)


def test_default_grid_is_the_original_k_sweep():
    shapes = grid()
    assert shapes == [Shape(8192, 8192, k) for k in (512, 1024, 2048, 4096, 8192, 16384)]
    assert shapes[0].label == "8192x8192x512"


def test_grid_is_a_cartesian_product_k_fastest():
    assert grid("1,2", "3", "4,5") == [Shape(1, 3, 4), Shape(1, 3, 5), Shape(2, 3, 4), Shape(2, 3, 5)]


def test_shape_flops_and_tflops():
    s = Shape(8192, 8192, 512)
    assert s.flops == 2 * 8192 * 8192 * 512
    assert s.tflops(1.0) == pytest.approx(s.flops / 1e-3 / 1e12)


def test_llm_shapes_are_llama3_8b_and_70b_linear_layers():
    nk = [  # (N, K) from the models' config.json, written out by hand
        (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336),
        (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672),
    ]  # fmt: skip
    expected = [Shape(m, n, k) for n, k in nk for m in (1, 16, 128, 1024, 8192)]
    assert llm_shapes() == expected


def test_llm_train_is_the_backward_products_of_the_llm_weights_in_their_layouts():
    """For each weight W [N, K] and T tokens: grad_x = grad [T, N] @ W [N, K] (M=T, N=K, K=N; A and
    B row) and grad_W^T = grad^T [N, T] @ x [T, K] (M=N, N=K, K=T; A t, B row)."""
    weights = sorted({(s.N, s.K) for s in llm_shapes()})
    shapes = llm_train_shapes()
    assert resolve("llm-train", None, None, None) == shapes and len(shapes) == 64
    expected = {
        product
        for n, k in weights
        for t in (1024, 2048, 4096, 8192)
        for product in (Shape(t, k, n, "row", "row"), Shape(n, k, t, "t", "row"))
    }
    assert set(shapes) == expected and len(set(shapes)) == 64
    assert shapes[:2] == [Shape(1024, 4096, 6144, "row", "row"), Shape(6144, 4096, 1024, "t", "row")]
    # o's grad_x and grad_W^T at 4096 tokens are both 4096^3: told apart by their layouts only
    assert Shape(4096, 4096, 4096, "row", "row") in shapes and Shape(4096, 4096, 4096, "t", "row") in shapes
    assert all(s.fixed_layouts for s in shapes) and fixed_layouts(shapes)
    assert not any(fixed_layouts(f()) for f in (llm_shapes, holdout_shapes, moe_shapes))
    assert shapes[1].to_json() == {"M": 6144, "N": 4096, "K": 1024} and shapes[1].label == "6144x4096x1024"


def test_llm_dense_is_the_llm_weights_at_powers_of_two_and_their_midpoints():
    assert DENSE_M == (
        1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
        2048, 3072, 4096, 6144, 8192, 12288, 16384,
    )  # fmt: skip
    assert all(b <= 1.5 * a for a, b in itertools.pairwise(DENSE_M[1:]))  # from M = 2 on
    nk = list(dict.fromkeys((s.N, s.K) for s in llm_shapes()))
    assert len(nk) == 8
    assert llm_dense_shapes() == [Shape(m, n, k) for n, k in nk for m in DENSE_M]
    assert resolve("llm-dense", None, None, None) == llm_dense_shapes()


def test_tune_takes_the_dense_preset(tmp_path, monkeypatch, capsys):
    """`tune --shapes llm-dense` resolves its shapes and goes on to look for the GPU (none here);
    an unknown preset stops before, naming the presets."""
    import torch

    from gluon_survey.driver import tune

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["--name", "h100", "--match", "H100", "--output", str(tmp_path / "t.json")]
    assert tune.main(["--shapes", "llm-dense", *args]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert tune.main(["--shapes", "llm-sparse", *args]) == 2
    assert "expected 'llm', 'llm-dense', 'llm-train', 'holdout', 'moe' or a CSV" in capsys.readouterr().err
    assert tune.main(["--shapes", "moe", *args]) == 2
    assert "grouped shapes; tune builds matmul's table of dense GEMMs" in capsys.readouterr().err
    assert tune.main(["--modes", "grouped,torch", *args]) == 2
    assert "mode 'grouped' computes grouped (mixture-of-experts) GEMMs" in capsys.readouterr().err


def test_holdout_shapes_share_no_weight_with_llm():
    nk = [  # (N, K) of Llama-3.2-1B, -3B, Qwen2.5-7B, -14B from their config.json, by hand
        (3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192),
        (5120, 3072), (3072, 3072), (16384, 3072), (3072, 8192),
        (4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944),
        (7168, 5120), (5120, 5120), (27648, 5120), (5120, 13824),
    ]  # fmt: skip
    assert holdout_shapes() == [Shape(m, n, k) for n, k in nk for m in (1, 16, 64, 256, 4096)]
    assert not {(s.N, s.K) for s in holdout_shapes()} & {(s.N, s.K) for s in llm_shapes()}
    assert resolve("holdout", None, None, None) == holdout_shapes()


def test_read_csv_header_comments_and_blank_lines(tmp_path):
    path = tmp_path / "shapes.csv"
    path.write_text("# my shapes\nM,N,K\n\n1, 4096, 4096  # decode\n128,8192,8192\n")
    assert read_csv(path) == [Shape(1, 4096, 4096), Shape(128, 8192, 8192)]


def test_read_csv_without_header(tmp_path):
    path = tmp_path / "shapes.csv"
    path.write_text("16,32,64\n")
    assert read_csv(path) == [Shape(16, 32, 64)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,2\n", ":1: expected 3 fields M,N,K or 6 fields T,N,K,E,topk,routing, got 2"),
        ("M,N,K\n1,2,3,4,5,6\n", ":2: expected 3 fields M,N,K, got 6"),
        ("1,2,3\n16,8,8,4,2,uniform\n", ":2: expected 3 fields M,N,K, got 6"),
        ("16,8,8,4,2,uniform\n1,2,3\n", ":2: expected 6 fields T,N,K,E,topk,routing, got 3"),
        ("16,8,8,4,2,skewed\n", ":1: unknown routing 'skewed'; use one of uniform, zipf, half"),
        ("16,8,8,4,8,zipf\n", ":1: topk = 8 is more than the E = 4 experts"),
        ("M,N,K\n1,2,x\n", ":2: 'x' is not an integer"),
        ("1,2,0\n", ":1: 0 must be at least 1"),
        ("# nothing\n", "no M,N,K or T,N,K,E,topk,routing rows"),
    ],
)
def test_read_csv_errors_point_at_the_line(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        read_csv(path)
    assert message in str(err.value)


def test_read_csv_missing_file(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        read_csv(tmp_path / "missing.csv")


def test_resolve(tmp_path):
    assert resolve(None, None, None, None) == grid()
    assert resolve(None, "64", None, "32") == grid("64", "8192", "32")
    assert resolve("llm", None, None, None) == llm_shapes()
    path = tmp_path / "s.csv"
    path.write_text("1,2,3\n")
    assert resolve(str(path), None, None, None) == [Shape(1, 2, 3)]
    with pytest.raises(ValueError, match="either --shapes or --m/--n/--k"):
        resolve("llm", "64", None, None)
    with pytest.raises(ValueError, match="'llm', 'llm-dense', 'llm-train', 'holdout', 'moe' or a CSV"):
        resolve("square", None, None, None)


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("512:16384", [512, 1024, 2048, 4096, 8192, 16384]),  # start:stop doubles
        ("1:8", [1, 2, 4, 8]),
        ("64:64", [64]),
        ("16,512:2048", [16, 512, 1024, 2048]),
    ],
)
def test_two_field_ranges_double(spec, sizes):
    assert parse_dim(spec, "k") == sizes


@pytest.mark.parametrize(
    ("spec", "message"),
    [("512:1000", "1000 is not 512 times a power of 2"), ("512:256", "stops (256) before it starts (512)")],
)
def test_a_doubling_range_ends_on_start_times_a_power_of_two(spec, message):
    with pytest.raises(ValueError, match="--k") as err:
        parse_dim(spec, "k")
    assert message in str(err.value)


def test_the_default_k_is_a_doubling_range():
    from gluon_survey.driver import shapes

    assert shapes.DEFAULT_K == "512:16384"
    assert parse_dim(shapes.DEFAULT_K) == [512, 1024, 2048, 4096, 8192, 16384]


# ------------------------------------------------------------------------------------------------
# Grouped shapes: the moe preset, routing counts, grouped CSV rows


def test_moe_is_four_models_expert_gemms_in_three_routings_at_six_token_counts():
    shapes = moe_shapes()
    assert len(shapes) == 4 * 2 * 3 * 6 and len(set(shapes)) == len(shapes)
    experts = {(s.E, s.topk, s.N, s.K) for s in shapes}
    assert experts == {
        (8, 2, 2 * 14336, 4096), (8, 2, 4096, 14336),  # Mixtral-8x7B gate_up, down
        (128, 8, 2 * 768, 2048), (128, 8, 2048, 768),  # Qwen3-30B-A3B
        (256, 8, 2 * 2048, 7168), (256, 8, 7168, 2048),  # DeepSeek-V3
        (32, 4, 2 * 2880, 2880), (32, 4, 2880, 2880),  # GPT-OSS-20B
    }  # fmt: skip
    assert {s.routing for s in shapes} == {"uniform", "zipf", "half"}
    assert [s.T for s in shapes[:6]] == [1, 16, 64, 512, 4096, 16384]  # T varies fastest
    first = shapes[0]
    assert (first.M, first.flops) == (first.T * first.topk, 2 * first.T * first.topk * first.N * first.K)
    assert first.label == "28672x4096 E=8 top-2 T=1 uniform" and first.tokens == 1
    assert resolve("moe", None, None, None) == shapes


def test_a_grouped_shape_round_trips_through_its_json_and_stays_apart_from_dense():
    g = GroupedShape(16, 1536, 2048, 128, 8, "zipf")
    assert g.to_json() == {"M": 128, "N": 1536, "K": 2048, "E": 128, "topk": 8, "routing": "zipf"}
    assert shape_of(**g.to_json()) == g
    assert shape_of(128, 1536, 2048) == Shape(128, 1536, 2048) != g
    with pytest.raises(ValueError, match="topk dividing M"):
        shape_of(129, 1536, 2048, 128, 8, "zipf")


@pytest.mark.parametrize("shape", moe_shapes()[::5], ids=lambda s: s.label)
def test_routing_counts_sum_to_the_rows_and_repeat_from_the_seed(shape):
    counts = routing_counts(shape, seed=0)
    assert len(counts) == shape.E and min(counts) >= 0 and sum(counts) == shape.M
    assert routing_counts(shape, seed=0) == counts
    assert max(counts) <= (shape.T if shape.routing != "half" else shape.M)  # a token picks an expert once


def test_gate_up_and_down_of_a_layer_share_the_routing_and_seeds_change_it():
    gate_up, down = (
        GroupedShape(512, 4096, 7168, 256, 8, "zipf"),
        GroupedShape(512, 7168, 2048, 256, 8, "zipf"),
    )
    assert routing_counts(gate_up, 0) == routing_counts(down, 0)
    assert routing_counts(gate_up, 0) != routing_counts(gate_up, 1)
    assert sum(routing_counts(gate_up, -7)) == gate_up.M  # --seed takes any integer


def test_skewed_routings_leave_experts_without_rows():
    half = routing_counts(GroupedShape(512, 64, 64, 32, 4, "half"), seed=3)
    assert max(half) == 512 * 4 // 2 and 0 in routing_counts(GroupedShape(16, 64, 64, 32, 4, "half"), 3)
    zipf = sorted(routing_counts(GroupedShape(64, 64, 64, 128, 8, "zipf"), seed=0), reverse=True)
    uniform = sorted(routing_counts(GroupedShape(64, 64, 64, 128, 8, "uniform"), seed=0), reverse=True)
    assert zipf.count(0) > uniform.count(0) > 0 and zipf[0] > uniform[0]
    one_token = routing_counts(GroupedShape(1, 64, 64, 128, 8, "uniform"), seed=0)
    assert sorted(set(one_token)) == [0, 1] and one_token.count(0) == 120  # 8 distinct experts


def test_read_csv_takes_grouped_rows(tmp_path):
    path = tmp_path / "moe.csv"
    path.write_text("# tiny\nT,N,K,E,topk,routing\n16,256,128,4,2,uniform\n512,128,256,4,2,ZIPF\n")
    assert read_csv(path) == [
        GroupedShape(16, 256, 128, 4, 2, "uniform"),
        GroupedShape(512, 128, 256, 4, 2, "zipf"),
    ]
