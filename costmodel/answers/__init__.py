"""What a question answers, one object per question for the CLI, the app and the API: the
numbers and what to say beside them (verdict, nearest fit, caveats). Above ``serve``,
``engine`` and ``catalog``, which it combines (``docs/ARCHITECTURE.md``)."""
