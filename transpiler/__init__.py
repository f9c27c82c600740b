"""TorchScript IR into our own small typed IR: op table, passes, fusion, scheduling and memory planning."""
