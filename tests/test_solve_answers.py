"""Issue 35, item 4: solve and bounds lead with the full model's answer rounded to a
usable degree, echo what they assumed, name the link, and warn when a group crosses
nodes; the Scaling Book's closed form counts the state the framework keeps."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

import costmodel
from costmodel.cli import main
from costmodel.specs.checks import SpecError


def _json(*argv: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--json"]) == 0
    return json.loads(out.getvalue())


XXL = ("solve", "min-fsdp", "--model", "xxl", "--budget-gb", "95", "--batch-tokens", "0")


def test_the_closed_form_counts_the_state_fsdp2_keeps():
    """FSDP2 keeps fp32 master, gradients and Adam (16 B/param), no bf16 copy: the same
    answer as fp32 training; torch.autocast's reference keeps the copy (18 B/param)."""
    fsdp2 = _json(*XXL, "--framework", "fsdp2")
    fp32 = _json(*XXL, "--precision", "fp32")
    reference = _json(*XXL)
    assert fsdp2["answer"]["fsdp"] == fp32["answer"]["fsdp"] == 38
    assert reference["answer"]["fsdp"] == 42
    assert fsdp2["book"]["state_bytes"] * 18 == reference["book"]["state_bytes"] * 16


def test_min_fsdp_leads_with_the_full_model_rounded_to_a_usable_degree():
    data = _json("solve", "min-fsdp", "--model", "llama3-8b", "--seq", "8192",
                 "--hardware", "h100-sxm", "--recompute", "full")  # fmt: skip
    answer = data["answer"]
    assert next(iter(data)) == "answer" and answer["fsdp"] == data["full_model"]["fsdp"] == 3
    assert answer["fsdp_usable"] == 4 and answer["from"].startswith("the full model")
    assert "8,192 tokens per device" in answer["assumed"] and "recompute full" in answer["assumed"]
    assert data["book"]["fsdp"] == 2  # the Scaling Book's approximation, below it


@pytest.mark.parametrize(("flag", "value"), [("--batch", "64"), ("--grad-accum", "4"),
                                             ("--microbatch", "2")])  # fmt: skip
def test_min_fsdp_refuses_a_batch_it_would_drop(capsys, flag, value):
    """Issue 60 ("every flag honoured or refused"): ``solve min-fsdp --batch 64`` (or
    --grad-accum) answered for one sequence per device, the flag dropped without a word, and
    --microbatch said "--hardware is required" beside --hardware; min-fsdp holds one
    device's tokens (--batch-tokens), so the others are refused in one line naming them."""
    ask = ["solve", "min-fsdp", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq",
           "8192", flag, value]  # fmt: skip
    assert main(ask) == 2
    err = capsys.readouterr().err
    assert f"leave {flag} out" in err and "--batch-tokens" in err and err.count("\n") == 1


def test_max_seq_says_the_batch_and_micro_batch_it_held():
    data = _json("solve", "max-seq", "--model", "llama3-8b", "--finetune", "qlora",
                 "--hardware", "rtx-4090", "--recompute", "full")  # fmt: skip
    assert "batch 4, micro-batch 1 per device x grad-accum 4" in data["assumed"]


def test_bounds_names_the_link_and_warns_across_nodes():
    """64 H100 of 8 per node: the fsdp ring crosses 8 nodes, each node's 8 ranks through 8
    NICs of 50 GB/s (400 GB/s per rank), not NVLink's 450 GB/s."""
    args = ("bounds", "--model", "llama3-8b", "--hardware", "h100-sxm")
    inside, across = _json(*args, "--fsdp", "8"), _json(*args, "--fsdp", "64")
    assert inside["link"].startswith("NVLink") and inside["warnings"] == []
    assert inside["bandwidth"] == 450e9
    assert across["link"].startswith("network across 8 nodes") and across["bandwidth"] == 400e9
    assert "crosses nodes" in across["warnings"][0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main([*args, "--fsdp", "64"])
    assert out.getvalue().startswith("warning: the fsdp group crosses nodes")


@pytest.mark.parametrize("question", ["max-seq", "max-batch"])
def test_a_question_nothing_answers_says_why_in_the_cli_as_the_api_does(capsys, question):
    """Issue 60's probe: ``solve max-seq`` printed ``seq None`` with no reason where the
    Python API gave one; the reason now comes from the one search both call."""
    assert main(["solve", question, "--model", "llama3-8b", "--hardware", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    field = question.split("-")[1]
    assert out.startswith(f"answer   none fits 72.00 GiB (77.31 GB) per device: even {field} 1 "
                          "does not fit: peak")  # fmt: skip


def test_solve_and_bounds_answer_in_sentences_with_units(capsys):
    """Issue 60's leftover: ``solve min-fsdp`` and ``bounds`` printed key dumps (dotted keys,
    raw floats). The answer leads, with its units; the book's closed form beside it."""
    assert main(["solve", "min-fsdp", "--model", "llama3-8b", "--hardware", "h100-sxm",
                 "--seq", "8192"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("answer   fsdp 8: the smallest degree whose per-device peak, ")
    assert "book     fsdp 4 (3.34 exact) by the Scaling Book approximation" in out
    assert "full_model." not in out and "fsdp_exact" not in out
    # the book has no answer (the unsharded activations exceed the budget): the full model's
    # answer stands and the book's line says why, in GiB
    assert main(["solve", "min-fsdp", "--model", "llama3-70b", "--hardware", "h100-sxm",
                 "--budget-gb", "80", "--seq", "8192"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "the unsharded activations alone (113.48 GiB) exceed the budget (74.51 GiB)" in out
    assert main(["bounds", "--model", "xxl", "--hardware", "tpu-v5p", "--fsdp", "16", "--tp",
                 "4", "--mx", "2", "--my", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith("answer      critical batch B* = 23,387 tokens a step (365 per device)")
    assert "459 TFLOP/s; fsdp over ICI" in out and "C/W = 2,550 FLOPs per byte" in out
    assert "time_s_at_critical_batch" not in out


def test_an_answer_the_positions_set_says_so_first(capsys):
    """A probe: GPT-2's answer read "seq 1,024: the largest whose per-device peak fits"
    above a note that the model's positions, not the budget, stopped the search."""
    assert main(["solve", "max-seq", "--model", "gpt2", "--hardware", "h100-sxm", "--gpus",
                 "1", "--batch", "1"]) == 0  # fmt: skip
    answer = capsys.readouterr().out.splitlines()[0]
    assert answer.startswith("answer   seq 1,024: the model's 1,024 learned positions")
    assert answer.endswith("(more may fit)")


def test_min_fsdp_answers_the_full_model_without_a_device_at_the_budget_given():
    """A probe: with --budget-gb and no --hardware the answer was the closed form's fsdp 4,
    which estimate finds 84.8 GiB at, and with --hardware h100-sxm fsdp 7. A memory answer
    at a given budget now comes from the full model either way (on the book's chip, said)."""
    ask = ("solve", "min-fsdp", "--model", "llama3-8b", "--budget-gb", "80", "--seq", "8192")
    bare, h100 = _json(*ask), _json(*ask, "--hardware", "h100-sxm")
    assert bare["answer"]["fsdp"] == h100["answer"]["fsdp"] == 7
    assert "the default --hardware" in bare["answer"]["assumed"]
    assert bare["book"]["fsdp"] == 4  # the Scaling Book's closed form, kept beside it


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["min-fsdp", "--model", "llama3-70b", "--budget-gb", "95", "--seq", "8192",
          "--hardware", "h100-sxm"], "--budget-gb must be <= h100-sxm's memory, 85.8993 GB"),
        (["max-batch", "--model", "llama3-8b", "--seq", "8192", "--hardware", "h100-sxm",
          "--fsdp", "8", "--budget-gib", "100"], "--budget-gib must be <= h100-sxm's memory"),
        (["min-fsdp", "--model", "xxl", "--budget-gb", "200", "--seq", "8192"],
         "tpu-v5p's memory (the default --hardware), 102.005 GB"),
    ],
)  # fmt: skip
def test_a_budget_over_the_devices_memory_is_refused(capsys, argv, words):
    """Issue 60's fourth probe: a budget of 95 GB on an 80 GiB H100 answered "fits" for an
    87 GiB peak. A peak over the device's memory does not fit it, whatever the budget, as
    offload's device budget is refused past it; the book's state-only question has no
    device and keeps any budget."""
    assert main(["solve", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    state_only = _json("solve", "min-fsdp", "--model", "xxl", "--budget-gb", "200",
                       "--batch-tokens", "0")  # fmt: skip
    assert state_only["answer"]["fsdp"] == 20


def test_the_api_refuses_a_budget_over_the_devices_memory():
    import costmodel
    from costmodel.specs.checks import SpecError

    with pytest.raises(SpecError, match="budget_gb must be <= h100-sxm's memory"):
        costmodel.max_batch("llama3-8b", hardware="h100-sxm", seq=8192, fsdp=8, budget_gb=200)


def test_a_headroom_beside_a_budget_is_refused_not_dropped(capsys):
    """A probe: ``--memory-headroom 0.5 --budget-gb 40`` answered against 40 GB, the
    headroom dropped without a word (as --budget-gb with --budget-gib is refused)."""
    ask = ["solve", "max-batch", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq",
           "8192", "--fsdp", "8", "--memory-headroom", "0.5", "--budget-gb", "40"]  # fmt: skip
    assert main(ask) == 2
    err = capsys.readouterr().err
    assert "--memory-headroom makes the budget a share" in err and err.count("\n") == 1
    with pytest.raises(SpecError, match="memory_headroom makes the budget") as caught:
        costmodel.max_batch("llama3-8b", hardware="h100-sxm", seq=8192, fsdp=8,
                            memory_headroom=0.5, budget_gib=40)  # fmt: skip
    assert caught.value.field == "memory_headroom"


def test_min_fsdp_of_no_tokens_on_a_device_prices_the_book_at_the_answers_sequence():
    """Issue 60's leftover: with --hardware, ``--batch-tokens 0`` is answered by the full model
    for one sequence a device, but the Scaling Book's line beside it priced 0.00 GiB of
    activations (fsdp 38 where one sequence's need fsdp 158): two questions side by side. The
    book's line now holds the answer's tokens, and the assumed line says it was rounded up;
    without a device the book's own state-only question is unchanged."""
    ask = ("solve", "min-fsdp", "--model", "xxl", "--hardware", "tpu-v5p", "--framework",
           "fsdp2", "--budget-gb", "95", "--seq", "8192")  # fmt: skip
    zero, one = _json(*ask, "--batch-tokens", "0"), _json(*ask)
    assert zero["book"] == one["book"] and zero["book"]["activation_bytes"] > 0
    assert zero["full_model"]["micro_batch_per_device"] == 1
    said = "--batch-tokens 0 rounded up to one sequence, in the book's line too"
    assert said in zero["answer"]["assumed"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*ask, "--batch-tokens", "0"]) == 0
    book = next(x for x in out.getvalue().splitlines() if x.startswith("book"))
    assert "0.00 GiB of activations" not in book and "134.38 GiB of activations" in book
    state_only = _json(*XXL, "--framework", "fsdp2")  # no device: the state alone
    assert state_only["book"]["activation_bytes"] == 0 and state_only["answer"]["fsdp"] == 38


def test_a_tight_answer_says_so_on_its_own_line(capsys):
    """Issue 60's probe: ``solve min-fsdp --budget-gb 80`` answered fsdp 7 "fits the 74.51
    GiB budget" on its answer line while its verdict, lines below, said TIGHT (reserved 88.5
    GiB over the 80 GiB device); ``max-batch`` alike. The answer line now says it too."""
    assert main(["solve", "min-fsdp", "--model", "llama3-8b", "--hardware", "h100-sxm",
                 "--budget-gb", "80", "--seq", "8192"]) == 0  # fmt: skip
    answer = capsys.readouterr().out.splitlines()[0]
    assert answer.startswith("answer   fsdp 7")
    assert "but TIGHT: reserved 88.51 GiB is over the device's 80.00 GiB" in answer
    argv = ["solve", "max-seq", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "8",
            "--batch", "8", "--framework", "fsdp2"]  # fmt: skip
    assert main(argv) == 0
    assert "but TIGHT: reserved 86.40 GiB" in capsys.readouterr().out.splitlines()[0]
    assert main([*argv, "--memory-headroom", "0.8"]) == 0  # 1.2 x 64 GiB stays within 80 GiB
    answer = capsys.readouterr().out.splitlines()[0]
    assert answer.startswith("answer   seq ") and "TIGHT" not in answer


def test_the_fsdp_condition_under_tp_is_per_fsdp_rank_and_per_device(capsys):
    """Issue 60's third probe: under tp 8 the book's FSDP bound B/X (tokens per fsdp rank,
    a tp group) was printed "per device", 8x the per-device figure beside B*'s."""
    assert main(["bounds", "--model", "llama3-70b", "--hardware", "h100-sxm", "--fsdp", "64",
                 "--tp", "8"]) == 0  # fmt: skip
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("conditions"))
    assert "19,788 tokens per fsdp rank (a tp group of 8: 2,474 per device)" in line
    # a fifth probe: "some split ... is compute-bound from 4,046" read as worse than this
    # split's own 3,401; it is the book's forward-pass form at this layout's two links
    assert "the book's mixed condition (a forward pass, at this layout's two links)" in line
    assert "some split" not in line and "can be lower" in line


def test_min_fsdp_searches_a_layout_whose_experts_are_split(capsys):
    """Issue 60's fourth probe: min_fsdp and solve min-fsdp with ep 8 failed ("ep * etp must
    divide tp * dp * fsdp * cp"), starting the question from fsdp 1; both now start from a
    group ep allows and answer the same degree, one sequence a device."""
    import costmodel

    api = costmodel.min_fsdp("mixtral-8x7b", hardware="h100-sxm", seq=4096, ep=8,
                             framework="megatron")  # fmt: skip
    assert api["fsdp"] is not None and api["fsdp"] % 8 == 0 and api["micro_batch_per_device"] == 1
    argv = ["solve", "min-fsdp", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--seq",
            "4096", "--ep", "8", "--framework", "megatron", "--json"]  # fmt: skip
    assert main(argv) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["answer"]["fsdp"] == api["fsdp"]
    assert cli["answer"]["assumed"].startswith("4,096 tokens per device (1 x seq 4096)")


def test_a_tight_answer_names_the_one_the_device_holds(capsys):
    """Issue 60's third and fourth probes: max_seq answered 8,936 (reserved 86.4 GiB on an
    80 GiB H100), max_batch 16 and min_fsdp 24 likewise TIGHT, with no safe answer beside;
    each now names the largest (smallest) whose allocator reserve the device holds."""
    import costmodel

    seq = costmodel.max_seq("llama3-8b", hardware="h100-sxm", gpus=8, batch=8,
                            framework="fsdp2")  # fmt: skip
    assert seq["verdict"]["memory"]["tight"] and seq["seq_untight"] < seq["seq"]
    at = costmodel.estimate("llama3-8b", hardware="h100-sxm", gpus=8, batch=8,
                            framework="fsdp2", seq=seq["seq_untight"])  # fmt: skip
    assert at.fit().fits and not at.fit().tight
    assert main(["solve", "max-seq", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus",
                 "8", "--batch", "8", "--framework", "fsdp2"]) == 0  # fmt: skip
    said = f"the largest whose reserve the device holds: seq {seq['seq_untight']:,}"
    assert said in capsys.readouterr().out
    fsdp = costmodel.min_fsdp("mixtral-8x7b", hardware="h100-sxm", seq=4096, ep=8,
                              framework="megatron")  # fmt: skip
    assert fsdp["fsdp_untight"] is not None and fsdp["fsdp_untight"] > fsdp["fsdp"]


def test_min_fsdp_holds_the_tokens_at_once_beside_a_dp_given(capsys):
    """Issue 60's probe: ``solve min-fsdp --dp 4`` failed (a batch of one device's
    sequences that dp x fsdp must divide), and ``--batch-tokens 8192`` at seq 4,096 held one
    sequence a micro-batch over two micro-batches, where the book's line beside it holds
    both at once. Now the batch spans dp x fsdp devices and each holds its tokens in one
    micro-batch."""
    base = ["solve", "min-fsdp", "--model", "llama3-8b", "--hardware", "h100-sxm", "--seq",
            "4096", "--batch-tokens", "8192"]  # fmt: skip
    assert main([*base, "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["full_model"]["micro_batch_per_device"] == 2
    assert "(2 x seq 4096)" in alone["answer"]["assumed"]
    assert main([*base, "--dp", "4", "--json"]) == 0
    beside = json.loads(capsys.readouterr().out)
    assert beside["full_model"]["micro_batch_per_device"] == 2
    assert beside["answer"]["fsdp"] == alone["answer"]["fsdp"]  # dp replicates the state
    api = costmodel.min_fsdp("llama3-8b", hardware="h100-sxm", seq=4096, dp=4)
    assert api["fsdp"] == costmodel.min_fsdp("llama3-8b", hardware="h100-sxm", seq=4096)["fsdp"]
    assert "dp 4" in api["assumed"]


def test_max_seq_says_a_pipelines_answer_depends_on_its_micro_batches(capsys):
    """Issue 60's fifth probe: max-seq under pp 4 answered 85,467 at the default batch of 4
    (2 micro-batches in flight) and 43,792 at --batch 64, with nothing said."""
    argv = ["solve", "max-seq", "--model", "llama3-70b", "--hardware", "h100-sxm", "--tp", "8",
            "--pp", "4", "--fsdp", "2", "--framework", "megatron"]  # fmt: skip
    argv += ["--recompute", "full"]
    assert main(argv) == 0
    note = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("note"))
    assert "at grad-accum 2 a pipeline of 4 stages holds 2 micro-batches in flight" in note


def test_max_batch_takes_a_grad_accum_without_naming_a_batch_never_given(capsys):
    """Issue 60's sixth probe: max-batch with --grad-accum 8 failed "grad_accum must divide
    batch (got batch=4, grad_accum=8)", a default batch the question solves for."""
    argv = ["solve", "max-batch", "--model", "llama3-8b", "--hardware", "h100-sxm", "--gpus",
            "8", "--seq", "8192", "--framework", "fsdp2", "--grad-accum", "8"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("answer   batch ") and "grad-accum 8" in out
    api = costmodel.max_batch("llama3-8b", hardware="h100-sxm", gpus=8, seq=8192,
                              framework="fsdp2", grad_accum=8)  # fmt: skip
    assert f"answer   batch {api['batch']:,}:" in out
