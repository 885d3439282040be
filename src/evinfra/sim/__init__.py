"""The discrete-event runtime: virtual clock, cost-model executor, cluster scale."""
