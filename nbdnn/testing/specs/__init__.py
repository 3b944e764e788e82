"""nbdnn.testing.specs."""
