"""The public front end: validate once, infer shapes, dispatch to nbdnn.cpu / nbdnn.cuda."""
