"""Capturing work for replay: graph.py (nbdnn.cuda.Graph over CUDA graphs),
plan_record.py (eager call plans: a call's launches recorded once, replayed)."""
