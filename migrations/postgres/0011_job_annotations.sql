-- Issue 28. What a team writes about a run beside its spec, editable after it ran (PATCH /v1/jobs/{id}):
-- tags, a JSON array of short strings the run history filters by, and a note, free text searched with the
-- name. Tags hold no quotes, so the history finds a tag as the text `"tag"` inside the array.
ALTER TABLE jobs ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
ALTER TABLE jobs ADD COLUMN note TEXT NOT NULL DEFAULT '';
