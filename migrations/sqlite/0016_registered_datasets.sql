-- Issue 55. A sharded data set registered by reference: where it lies (`s3://BUCKET/PREFIX` or a folder
-- every node mounts), read and checked when registered; none for an uploaded file. A registered data set's
-- bytes are not the server's: they do not count against the team's storage quota.
ALTER TABLE datasets ADD COLUMN source TEXT;
