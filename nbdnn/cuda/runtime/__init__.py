"""nbdnn.cuda.runtime."""
