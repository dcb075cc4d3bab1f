"""ampe.formats: one typed model per file format, shared by the code that writes a file and the code that reads it.

* :mod:`~ampe.formats.frequency_plan` — a strategy's per-stage clock lists (inside plans and job files);
* :mod:`~ampe.formats.plan` — ``ampe.plan/1``, the ranked strategies ``ampe search``/``replan`` write and ``evaluate``,
  ``frontier``, ``replan``, ``trial`` and ``report`` read;
* :mod:`~ampe.formats.job` — ``ampe.job/1``, what the trial runner hands every rank.

Every reader validates with these models: wrong types, missing fields, NaN/Infinity, booleans where numbers belong
and out-of-range clocks become one :class:`~ampe.errors.InputError` naming the file and the field. Adding a field is
one edit here, checked on both sides of the process boundary.

Imports pydantic, the standard library, :mod:`ampe.errors` and :mod:`ampe.io` only (the runtime imports it inside every
rank; docs/layout.md, checked by tests/test_layout.py).
"""
