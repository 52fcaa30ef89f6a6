"""Fitted parameters as records (issue 57, item 1): the catalog holds what the records say,
every record carries its in-sample and leave-one-source-out error, and the leave-one-source-
out run refits a parameter without each source (a parameter only one source constrains
falls back to its prior when that source is left out, so its error there grows)."""

from __future__ import annotations

import json

import pytest

from costmodel import get_hardware
from costmodel.catalog.fitted import (
    Axis,
    FitRuns,
    Fitted,
    apply,
    fitted,
    fitted_lines,
    loso_sentence,
    reads,
)
from costmodel.catalog.hardware import HARDWARE
from validate.published import loso
from validate.published.__main__ import main
from validate.published.journal import FoldJournal
from validate.published.loso_main import FITTED, records_key

NOTES = json.loads((FITTED.parent / "hardware.json").read_text())["_notes"]


@pytest.mark.parametrize("name", list(fitted()))
def test_each_record_is_what_the_catalog_holds(name):
    """Applying a record's values to each profile it names changes nothing: the catalog
    states exactly the fitted values (times each profile's base, e.g. a Grace host's
    slowdown)."""
    record = fitted()[name]
    assert record.devices and set(record.devices) <= set(HARDWARE)
    for device in record.devices:
        hw = get_hardware(device)
        assert apply(record, hw, record.values) == hw, device


@pytest.mark.parametrize("name", list(fitted()))
def test_each_record_states_its_error_in_sample_and_leave_one_source_out(name):
    """Every fitted parameter carries its figures (``validate.published --loso --record``)
    and the hardware notes quote its leave-one-source-out median beside it."""
    record = fitted()[name]
    figs = record.figures
    assert figs["runs"] > 0 and figs["sources"], "run python -m validate.published --loso --record"
    for part in ("in_sample", "loso"):
        assert {"median", "p90", "worst"} <= set(figs[part])
    assert set(figs["folds"]) == set(figs["sources"])
    assert f"{name} leave-one-source-out {100 * figs['loso']['median']:.1f} % median" in NOTES


def test_the_hardware_notes_end_with_the_recorded_figures():
    assert NOTES.endswith(loso_sentence())


def test_a_device_lists_its_fitted_parameters():
    lines = fitted_lines("h100-sxm")
    names = [line.split(":")[0] for line in lines]
    assert names == [n for n, r in fitted().items() if "h100-sxm" in r.devices]
    assert all("with each source left out of the fit" in line for line in lines)
    assert fitted_lines("cpu") == []


def test_which_estimates_read_a_record():
    recs = fitted()
    assert reads(recs["network"]) == {"training"}
    assert reads(recs["grouped_gemm"]) == {"training"}  # serving: its own serve_matmul
    assert reads(recs["serving"]) == {"serving"}
    assert reads(recs["tpu_v6e"]) == {"training", "serving"}  # efficiency.matmul: both


GRID = tuple(round(0.5 + 0.05 * i, 2) for i in range(11))


def _network_x1000(tune) -> float:
    return 1000 * tune(get_hardware("h100-sxm")).eff("network")


def _toy(prior: float = 0.9) -> tuple[dict[str, Fitted], list[loso.Target]]:
    """One parameter (efficiency.network on the h100-sxm) fitted on source A's runs only,
    whose predictions are 1000 x the value: A measures 800 (best 0.8), B's run is not in
    the fit."""
    record = Fitted(
        name="toy",
        devices=("h100-sxm",),
        axes=(Axis("net", 0.8, prior, GRID, (("efficiency.network", 1.0),)),),
        fit=FitRuns(files=("a.json",), quantity="tokens_per_s_per_gpu"),
        method="a toy",
    )

    def target(source: str, file: str, measured: float) -> loso.Target:
        traits = {"moe": False, "kind": "gpu", "framework": "fsdp2", "recompute": "none",
                  "file": file}  # fmt: skip
        return loso.Target(source, f"{source}-run", "tokens_per_s_per_gpu", measured, "h100-sxm",
                           traits, _network_x1000)  # fmt: skip

    return {"toy": record}, [target("A", "a.json", 800.0), target("B", "b.json", 850.0)]


def test_a_parameter_only_one_source_constrains_is_worse_left_out():
    """Left out, source A's fit has no runs: the prior (0.9) predicts A, 12.5 % off, where
    its in-sample error is 0; B, not in the fit, is predicted alike both ways."""
    records, targets = _toy()
    result = loso.run(records, targets)
    assert result.refit["toy"] == (0.8,) and result.folds["A"]["toy"] == (0.9,)
    rows = {r["source"]: r for r in result.rows}
    assert rows["A"]["in_sample_err"] == pytest.approx(0.0)
    assert rows["A"]["loso_err"] == pytest.approx(0.125)
    assert rows["B"]["loso_err"] == pytest.approx(rows["B"]["in_sample_err"])
    figs = loso.figures(result, records)["toy"]
    assert figs["loso"]["median"] > figs["in_sample"]["median"]


def test_the_v6e_efficiencies_fall_back_to_their_priors_without_tpu_recipes():
    """On the real corpus: the v6e's efficiencies are fitted on one source (Google's
    tpu-recipes), so leaving it out predicts its runs at the v5e's priors, worse than
    in-sample, as the record states."""
    record = fitted()["tpu_v6e"]
    targets, _ = loso.training_targets(loso.ROOT / "validate/published/data/tpu_recipes.json")
    result = loso.run({"tpu_v6e": record}, targets)
    assert result.folds["tpu-recipes"]["tpu_v6e"] == record.priors
    figs = loso.figures(result, {"tpu_v6e": record})["tpu_v6e"]
    assert figs["loso"]["median"] > 2 * figs["in_sample"]["median"]
    for part in ("in_sample", "loso"):
        assert figs[part]["median"] == pytest.approx(record.figures[part]["median"], abs=5e-4)


@pytest.mark.slow
def test_the_recorded_training_figures_are_a_fresh_runs():
    """Every training record's figures, recomputed from scratch (a minute or two)."""
    records = {n: r for n, r in fitted().items() if r.fit.quantity != "serving"}
    targets, _ = loso.corpus(serving_files=())
    figs = loso.figures(loso.run(records, targets), records)
    for name, record in records.items():
        for part in ("in_sample", "loso"):
            got, want = figs[name][part], record.figures[part]
            assert got["median"] == pytest.approx(want["median"], abs=5e-4), (name, part)
            assert got["worst"] == pytest.approx(want["worst"], abs=5e-4), (name, part)


def test_a_journal_keeps_finished_folds_for_the_same_records(tmp_path):
    records, targets = _toy()
    path = tmp_path / "loso.jsonl"
    first = loso.run(records, targets, journal=FoldJournal(path, False, "k1"))
    kept = FoldJournal(path, True, "k1")
    assert kept.done("A")[0] == {"toy": (0.9,)} and len(kept.done("A")[1]) == 1
    again = loso.run(records, targets, journal=kept)
    assert [r["loso"] for r in again.rows] == [r["loso"] for r in first.rows]
    assert FoldJournal(path, True, "other").done("A") is None  # other records: start over


def test_the_journal_key_follows_the_records_and_the_runs(tmp_path):
    corpus = tmp_path / "runs.json"
    corpus.write_text('{"runs": []}')
    key = records_key([corpus])
    corpus.write_text('{"runs": [{}]}')
    assert records_key([corpus]) != key


def test_loso_takes_every_corpus_file_not_runs(capsys):
    assert main(["--loso", "--runs", "x.json"]) == 2
    assert "--loso takes every corpus file" in capsys.readouterr().err
    assert main(["--record"]) == 2


def test_the_serving_record_states_its_moe_runs_figures_as_its_folds_predict_them():
    """The MoE serving caveat's numbers: each published MoE serving run predicted with the
    serving parameters its source's fold refitted without it (the recorded folds), and with
    the catalog's values, summarised as ``--record`` wrote them."""
    record = fitted()["serving"]
    targets, _ = loso.corpus(training=())
    moe = [t for t in targets if t.traits["moe"]]
    assert len(moe) == record.figures["moe"]["runs"] > 0
    preds = loso.Predictions({"serving": record})
    folds = record.figures["folds"]
    inside = [preds(t, {"serving": record.values}) / t.measured - 1 for t in moe]
    outside = [preds(t, {"serving": tuple(folds[t.source])}) / t.measured - 1 for t in moe]
    for part, errors in (("in_sample", inside), ("loso", outside)):
        want = record.figures["moe"][part]
        assert loso.summary(errors)["median"] == pytest.approx(want["median"], abs=5e-4), part
        assert loso.summary(errors)["worst"] == pytest.approx(want["worst"], abs=5e-4), part
