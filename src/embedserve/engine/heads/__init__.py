"""The heads of each retrieval kind (one file per kind, a `retrieval.RetrievalHeads`), built by
`retrieval.build_retrieval` from the class its row of `loading.retrieval_kinds` names."""
