"""Device memory: arrays.py (allocation like an input, dtypes, alignment, host
copies), reuse.py (a traced run's allocations planned into one arena by lifetime),
strided.py (strided inputs made contiguous on the device)."""
