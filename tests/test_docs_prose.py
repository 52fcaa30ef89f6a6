"""Numbers the docs state in prose, each checked against the command that gives it (issue
60's seventh probe found four gone stale: tests/test_docs.py checks the printed output
blocks, not the sentences)."""

from __future__ import annotations

from pathlib import Path

import pytest

from costmodel.cli import main

DOCS = Path(__file__).resolve().parent.parent / "docs"
PLAN_1000 = ("plan", "--model", "llama3-70b", "--hardware", "h100-sxm", "--seq", "8192",
             "--global-batch", "1024", "--max-gpus", "1000")  # fmt: skip
MIXTRAL = ("plan", "--model", "mixtral-8x7b", "--hardware", "h100-sxm", "--gpus", "16",
           "--seq", "4096", "--global-batch", "64")  # fmt: skip
COST = ("plan", "--model", "llama3-8b", "--hardware", "h100-sxm,b200,mi300x", "--max-gpus",
        "64", "--seq", "8192", "--global-batch-tokens", "4194304", "--token-budget", "15e12",
        "--price-per-hour", "2.5,4.5,2.2", "--objective", "cost")  # fmt: skip
DEEPSEEK = ("serve", "--model", "deepseek-v3", "--input", "2000", "--output", "1000",
            "--batch", "64", "--precision", "fp8", "--tp", "8", "--dp", "2", "--ep",
            "16")  # fmt: skip

CLAIMS = [
    ("planner.md", "(1,057,256 layouts enumerated,\n82,378 valid ones evaluated)", PLAN_1000,
     ["1,057,256 layouts enumerated, 82,378 valid evaluated"]),
    ("planner.md", "fsdp 8 x cp 2, ep 8 (2.839 s)", MIXTRAL,
     ["1  fsdp2 dp1 fsdp8 tp1 pp1 cp2 ep8 mb1 ga8 none", "2.839s"]),
    ("planner.md", "first (16 GPUs, 22,769 tokens/s per GPU, $823,492 for 15T tokens)", COST,
     ["1  b200         16 ", "22,769", "$823,492", "$846,370", "$1,070,286", "$821,754"]),
    ("serving.md", "gives a 25.8 ms TPOT and up to 154 sequences a replica", DEEPSEEK,
     ["TPOT (decode step)     25.8 ms", "up to 154 sequences fit a replica"]),
]  # fmt: skip


@pytest.mark.parametrize(("doc", "prose", "argv", "printed"), CLAIMS,
                         ids=[c[1][:40] for c in CLAIMS])  # fmt: skip
def test_a_number_in_the_prose_is_what_the_command_prints(capsys, doc, prose, argv, printed):
    assert prose in (DOCS / doc).read_text()
    assert main(list(argv)) == 0
    out = capsys.readouterr().out
    for text in printed:
        assert text in out, text
