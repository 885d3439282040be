"""Side-by-side benchmarks: scenarios, parallel simulator runs, results, reports, plots."""
