-- Revocation that holds for every credential, JWTs included, without a
-- database read per request. Every instance keeps in memory what was revoked
-- (src/auth/revocations.ts); these triggers record each revocation here and
-- announce it at commit on the channel every instance listens to
-- (src/auth/credential-changes.ts). A revocation is recorded by the trigger
-- of the change itself, so no code path, and no hand-written UPDATE in psql,
-- can forget to.
--
-- What revokes:
-- - a session ended (sessions.revoked_at set): its refresh token, its opaque
--   access tokens and every JWT naming it (`sid`);
-- - a user's credential_epoch raised: every JWT of that user issued at an
--   older epoch (`gen`). A role or password change raises it by itself
--   (users_bump_credential_epoch); "log out everywhere" raises it explicitly;
-- - a user deleted: everything of that user.

-- Raised, never lowered; a JWT carries the epoch it was issued at.
ALTER TABLE users ADD COLUMN credential_epoch integer NOT NULL DEFAULT 0;

-- Shown by GET /auth/sessions.
ALTER TABLE sessions
  ADD COLUMN last_used_at   timestamptz(3),
  ADD COLUMN user_agent     text CHECK (char_length(user_agent) <= 256),
  ADD COLUMN client_address text CHECK (char_length(client_address) <= 64);
CREATE INDEX sessions_user_id_live_idx ON sessions (user_id, id) WHERE revoked_at IS NULL;

-- What an instance loads when it cannot know what it missed (it starts, or
-- its listener reconnects). A row is needed only while a JWT it concerns can
-- still be valid: ACCESS_TOKEN_TTL is at most a day, plus the clock leeway.
CREATE TABLE revocations (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind        text NOT NULL CHECK (kind IN ('session', 'epoch', 'deleted')),
  user_id     bigint NOT NULL,
  session_id  bigint CHECK ((kind = 'session') = (session_id IS NOT NULL)),
  epoch       integer CHECK ((kind = 'epoch') = (epoch IS NOT NULL)),
  expires_at  timestamptz(3) NOT NULL DEFAULT now() + interval '1 day 5 minutes'
);
CREATE INDEX revocations_expires_at_idx ON revocations (expires_at);

CREATE FUNCTION users_bump_credential_epoch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.role IS DISTINCT FROM OLD.role OR NEW.password_hash IS DISTINCT FROM OLD.password_hash THEN
    NEW.credential_epoch := greatest(NEW.credential_epoch, OLD.credential_epoch + 1);
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER users_bump_credential_epoch BEFORE UPDATE ON users
  FOR EACH ROW EXECUTE FUNCTION users_bump_credential_epoch();

CREATE FUNCTION sessions_revoked() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO revocations (kind, user_id, session_id)
  SELECT 'session', n.user_id, n.id FROM new_sessions n JOIN old_sessions o ON o.id = n.id
  WHERE o.revoked_at IS NULL AND n.revoked_at IS NOT NULL;
  RETURN NULL;
END $$;
CREATE TRIGGER sessions_revoked AFTER UPDATE ON sessions
  REFERENCING OLD TABLE AS old_sessions NEW TABLE AS new_sessions FOR EACH STATEMENT EXECUTE FUNCTION sessions_revoked();

CREATE FUNCTION users_epoch_raised() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO revocations (kind, user_id, epoch)
  SELECT 'epoch', n.id, n.credential_epoch FROM new_users n JOIN old_users o ON o.id = n.id
  WHERE n.credential_epoch > o.credential_epoch;
  RETURN NULL;
END $$;
CREATE TRIGGER users_epoch_raised AFTER UPDATE ON users
  REFERENCING OLD TABLE AS old_users NEW TABLE AS new_users FOR EACH STATEMENT EXECUTE FUNCTION users_epoch_raised();

CREATE FUNCTION users_deleted_revoke() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO revocations (kind, user_id) SELECT 'deleted', id FROM old_users;
  RETURN NULL;
END $$;
CREATE TRIGGER users_deleted_revoke AFTER DELETE ON users
  REFERENCING OLD TABLE AS old_users FOR EACH STATEMENT EXECUTE FUNCTION users_deleted_revoke();

-- TRUNCATE has no transition table; before it runs, the rows are still there.
CREATE FUNCTION users_truncated_revoke() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO revocations (kind, user_id) SELECT 'deleted', id FROM users;
  RETURN NULL;
END $$;
CREATE TRIGGER users_truncated_revoke BEFORE TRUNCATE ON users
  FOR EACH STATEMENT EXECUTE FUNCTION users_truncated_revoke();

-- One notification per statement on the channel of sql/004: 'sessions <id>,…'
-- and 'epochs <user>:<epoch>,…' ('<user>:deleted' for a deleted user), or
-- 'revocations' when the list would not fit in a payload: the listener then
-- reloads this table.
CREATE FUNCTION revocations_announce() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  sessions text;
  epochs text;
BEGIN
  SELECT string_agg(session_id::text, ',') INTO sessions FROM new_revocations WHERE kind = 'session';
  SELECT string_agg(user_id::text || ':' || CASE WHEN kind = 'deleted' THEN 'deleted' ELSE epoch::text END, ',')
    INTO epochs FROM new_revocations WHERE kind <> 'session';
  IF octet_length(coalesce(sessions, '')) > 7900 OR octet_length(coalesce(epochs, '')) > 7900 THEN
    PERFORM pg_notify('api_key_changes', 'revocations');
    RETURN NULL;
  END IF;
  IF sessions IS NOT NULL THEN PERFORM pg_notify('api_key_changes', 'sessions ' || sessions); END IF;
  IF epochs IS NOT NULL THEN PERFORM pg_notify('api_key_changes', 'epochs ' || epochs); END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER revocations_announce AFTER INSERT ON revocations
  REFERENCING NEW TABLE AS new_revocations FOR EACH STATEMENT EXECUTE FUNCTION revocations_announce();
