-- Tenancy (issue 11). The Postgres twin is migrations/postgres/0004_tenancy.sql.
--
-- A platform admin (platform = TRUE, role admin) creates teams, sets quotas, mints agent tokens and manages
-- every team's tokens; a team admin manages only its own team's tokens. Until now every admin acted as a
-- platform admin: only the bootstrap admin keeps that power.
ALTER TABLE tokens ADD COLUMN platform BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE tokens SET platform = TRUE WHERE role = 'admin' AND label = 'bootstrap admin';
-- Optional expiry (a token past it is refused like a revoked one), and when the token was last used (kept
-- to the minute, so authenticating does not write on every request).
ALTER TABLE tokens ADD COLUMN expires_at TEXT;
ALTER TABLE tokens ADD COLUMN last_used_at TEXT;
