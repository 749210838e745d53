"""What the benchmark scripts share: engine runners, workloads, inputs, tables and the machine line."""
