"""Model bundles: finding and checking a bundle folder (schema, weight files), loading its
networks (torch or ONNX Runtime), and making new (untrained) bundles."""
