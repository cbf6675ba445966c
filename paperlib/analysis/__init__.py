"""Analysis: the paper's tables and tests over saved results, without torch (§5.1, §5.2 and beyond the paper).

- ``significance``      the tests behind the p-values: Wilcoxon's signed-rank, Kendall's tau, Holm's adjustment
- ``ranking``           statistics of a plasticity ranking: agreement with the paper's, bootstrap, scale curves
- ``plasticity_table``  saved plasticity results: written, read back, ranked, collected as one table
- ``stats``             every table across finetuning runs: Tables 1 and 6, pairs, Takeaway 2, LoRA (``stats``)
- ``precision_check``   whether a cheaper precision (tf32, bf16) keeps the paper's conclusions (``precision``)
- ``capacity``          plasticity or capacity: Takeaway 2 inside groups of equal size, and where the two disagree
"""
