"""Sparse and multi-vector retrieval outside the engine: what the outputs look like and their
limits (`results`), ColBERT's query and document sequences (`inputs`), and the scores that
compare them (`scores`: MaxSim, sparse dot products, bge-m3's weighted sum). None of these import
torch, so the gateway can share them; `runner` cuts a whole file's texts into pieces under
the multi-vector limit of one offline call."""
