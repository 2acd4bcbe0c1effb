"""PyLate's ColBERT outputs for tests/engine/test_sparse_multivector.py, run in a subprocess.

PyLate 1.6 pins sentence-transformers 5.3.0 and transformers <= 5.3, and under the project's
sentence-transformers 6 its folder loading is bypassed (markers and lengths fall back to the
defaults), so it runs from its own reference environment, a `pip install --target` folder put
first on PYTHONPATH (see `PYLATE_ENV` in the test). Usage: python pylate_reference.py FOLDER
IN.json OUT.npz, IN holding {"queries": [...], "documents": [...]}.
"""

import json
import sys

import numpy as np
from pylate import models

folder, inputs, out = sys.argv[1:4]
with open(inputs) as f:
    texts = json.load(f)
model = models.ColBERT(folder, device="cpu")
arrays = {}
for kind, is_query in (("queries", True), ("documents", False)):
    vectors = model.encode(texts[kind], is_query=is_query, batch_size=4)
    tokens = model.tokenize(texts[kind], is_query=is_query)
    for i, v in enumerate(vectors):
        arrays[f"{kind}_{i}"] = np.asarray(v, dtype=np.float32)
        mask = tokens["attention_mask"][i].bool() if not is_query else slice(None)
        arrays[f"{kind}_ids_{i}"] = tokens["input_ids"][i][mask].numpy()
np.savez(out, **arrays)
