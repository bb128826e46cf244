-- The secret a placement's ranks prove to each other in the rendezvous and on the ring (issue 11): made at
-- start, the same on every assignment of the attempt, sent only to the agents holding them. NULL on
-- placements started before it existed.
ALTER TABLE assignments ADD COLUMN rendezvous_secret TEXT;
