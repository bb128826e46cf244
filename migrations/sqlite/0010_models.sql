-- Issue 15. Uploaded TorchScript models, team-scoped like datasets. `inputs` are forward's inputs in order
-- (the data set's tensors x.NAME); `report` is what the upload's check found (parameters, buffers,
-- BatchNorm, output shape), as `ringtrain models check` printed it.
CREATE TABLE models (
    id          BLOB PRIMARY KEY,
    team_id     BLOB NOT NULL REFERENCES teams (id),
    name        TEXT NOT NULL,
    path        TEXT NOT NULL,
    size_bytes  BIGINT NOT NULL,
    sha256      TEXT NOT NULL,
    inputs      TEXT NOT NULL,
    report      TEXT NOT NULL,
    created_at  TEXT NOT NULL
);
CREATE INDEX models_by_team ON models (team_id, created_at DESC);

-- A data set of named inputs (x.NAME tensors, for uploaded models) lists them: [{name, dtype, shape}];
-- empty for the one-`x` data sets of the built-in models. `labels`: classes (integers) or values (floats).
ALTER TABLE datasets ADD COLUMN inputs TEXT NOT NULL DEFAULT '[]';
ALTER TABLE datasets ADD COLUMN labels TEXT NOT NULL DEFAULT 'classes';
