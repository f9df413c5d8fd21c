"""The REST contract as the service checks it: request and answer bodies (schemas.py, with the observe
body's fast twin and its array scanner, jsonscan.py) and the dataset settings the client package
declares (dataset_settings.py). Every layer above the numerics speaks these types; they import only
core/ and the client package's contract."""
