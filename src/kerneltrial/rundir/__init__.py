"""The run directory: the contract between runner, analysis, verify and serving.

The ground floor of kerneltrial: imported by everything, importing nothing else of
kerneltrial, and no torch, numpy, pandas or matplotlib (tests/test_architecture.py), so that
every command, `--help` included, can read and write run directories cheaply.

- errors.py      RunDirError, the one error for an unusable run directory
- files.py       atomic JSON, flushed JSONL/CSV row appenders and readers, `now()`
- hashing.py     sha256 of bytes, files and (path, bytes) lists
- provenance.py  versions, git state, source digest and archive, nvidia-smi queries
- layout.py      the file names of kernel, serving, replicate and suite directories, `kind_of`
- documents.py   typed, frozen readers of plan.json and provenance.json
- summary_doc.py the typed, frozen reader of summary.json and its writer's shape
- model_summary_doc.py  the same for a model run's summary.json, every version still read
- serving_summary_doc.py  the same for a serving run's summary.json (and its accuracy cross-grade record)
"""
