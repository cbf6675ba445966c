"""Analysis: the paper's tables and tests over saved results, without torch (§5.1, §5.2 and beyond the paper).

- ``significance``      the tests behind the p-values: Wilcoxon's signed-rank, Kendall's tau, Holm's adjustment
- ``ranking``           statistics of a plasticity ranking: agreement with the paper's, bootstrap, scale curves
- ``plasticity_table``  saved plasticity results: written, read back, ranked, collected as one table
- ``tables``            the paper's tables over finetuning runs: Table 6, gains, averages, grid spread; Adam ablation
- ``component_tests``   the tests across benchmarks: Table 1, every pair, Takeaway 2 (P(f) against the results)
- ``lora_comparison``   LoRA against the components' own weights: Table 6 for each way of training
- ``summary``           every table of a sweep's runs at once, as notebook 07 shows them (the ``stats`` command)
- ``precision_check``   whether a cheaper precision (tf32, bf16) keeps the paper's conclusions (``precision``)
- ``capacity``          plasticity or capacity: Takeaway 2 inside groups of equal size, and where the two disagree
"""
