"""PyLate's ColBERT outputs for tests/engine/test_sparse_multivector.py, run in a subprocess.

PyLate 1.6 pins sentence-transformers 5.3.0 and transformers <= 5.3, and under the project's
sentence-transformers 6 its folder loading is bypassed (markers and lengths fall back to the
defaults), so it runs from its own reference environment, a `pip install --target` folder put
first on PYTHONPATH (`PYLATE_ENV` in the test; README.md, "Development", has the command).
Usage: python pylate_reference.py IN.json OUT_DIR FOLDER..., IN holding {"queries": [...],
"documents": [...]}; writes OUT_DIR/<folder name>.npz per folder (one process: PyLate's import
is most of its time).
"""

import json
import sys
from pathlib import Path

import numpy as np
from pylate import models

inputs, out_dir, *folders = sys.argv[1:]
with open(inputs) as f:
    texts = json.load(f)
for folder in folders:
    model = models.ColBERT(folder, device="cpu")
    arrays = {}
    for kind, is_query in (("queries", True), ("documents", False)):
        vectors = model.encode(texts[kind], is_query=is_query, batch_size=4)
        for i, (text, v) in enumerate(zip(texts[kind], vectors, strict=True)):
            arrays[f"{kind}_{i}"] = np.asarray(v, dtype=np.float32)
            # one input alone: a query's ids are its expanded length, a document's unpadded
            tokens = model.tokenize([text], is_query=is_query)
            arrays[f"{kind}_ids_{i}"] = tokens["input_ids"][0].numpy()
            arrays[f"{kind}_attended_{i}"] = tokens["attention_mask"][0].numpy()
    np.savez(Path(out_dir) / f"{Path(folder).name}.npz", **arrays)
