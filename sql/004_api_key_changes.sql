-- Every instance caches the API keys it has read (src/api-keys/key-cache.ts)
-- and must hear at once of any change to what it cached: a key deleted or
-- altered, its user deleted or given another role. Triggers announce these on
-- the channel api_key_changes (src/api-keys/key-changes.ts listens), so no
-- code path, and no hand-written UPDATE in psql, can forget to. pg_notify
-- runs in the transaction of the change and PostgreSQL delivers it only at
-- commit: a rolled-back change notifies nobody.
--
-- Statement-level, with transition tables: one notification per statement,
-- however many rows it touches (deleting 10,000 users is one notification,
-- not 10,000). Payload: 'keys <id>,<id>…' or 'users <id>,<id>…'; 'all' when
-- the list would not fit in a payload (8000 bytes) or for TRUNCATE.
-- last_used_at is written once a minute per key: an UPDATE that changes
-- nothing a cache holds notifies nothing.

CREATE FUNCTION announce_api_key_change(kind text, ids bigint[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  payload text;
BEGIN
  IF ids IS NULL OR cardinality(ids) = 0 THEN
    RETURN;
  END IF;
  payload := kind || ' ' || array_to_string(ids, ',');
  IF octet_length(payload) > 7900 THEN
    payload := 'all';
  END IF;
  PERFORM pg_notify('api_key_changes', payload);
END $$;

CREATE FUNCTION api_keys_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM announce_api_key_change('keys', (SELECT array_agg(id) FROM old_keys));
  RETURN NULL;
END $$;

-- Only what a cache holds counts: the key's hash, user, scopes and expiry (and id).
CREATE FUNCTION api_keys_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM announce_api_key_change('keys', (
    SELECT array_agg(o.id) FROM old_keys o
    WHERE NOT EXISTS (
      SELECT 1 FROM new_keys n
      WHERE n.id = o.id AND n.key_hash = o.key_hash AND n.user_id = o.user_id
        AND n.scopes = o.scopes AND n.expires_at IS NOT DISTINCT FROM o.expires_at)));
  RETURN NULL;
END $$;

CREATE FUNCTION users_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM announce_api_key_change('users', (SELECT array_agg(id) FROM old_users));
  RETURN NULL;
END $$;

-- A role change changes what every key of the user may do (scopes are narrowed by the role).
CREATE FUNCTION users_updated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM announce_api_key_change('users', (
    SELECT array_agg(o.id) FROM old_users o
    WHERE NOT EXISTS (SELECT 1 FROM new_users n WHERE n.id = o.id AND n.role = o.role)));
  RETURN NULL;
END $$;

CREATE FUNCTION api_key_tables_truncated() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('api_key_changes', 'all');
  RETURN NULL;
END $$;

-- PostgreSQL allows transition tables only on triggers of one event each.
CREATE TRIGGER api_keys_deleted AFTER DELETE ON api_keys
  REFERENCING OLD TABLE AS old_keys FOR EACH STATEMENT EXECUTE FUNCTION api_keys_deleted();
CREATE TRIGGER api_keys_updated AFTER UPDATE ON api_keys
  REFERENCING OLD TABLE AS old_keys NEW TABLE AS new_keys FOR EACH STATEMENT EXECUTE FUNCTION api_keys_updated();
CREATE TRIGGER api_keys_truncated AFTER TRUNCATE ON api_keys
  FOR EACH STATEMENT EXECUTE FUNCTION api_key_tables_truncated();
CREATE TRIGGER users_deleted AFTER DELETE ON users
  REFERENCING OLD TABLE AS old_users FOR EACH STATEMENT EXECUTE FUNCTION users_deleted();
CREATE TRIGGER users_updated AFTER UPDATE ON users
  REFERENCING OLD TABLE AS old_users NEW TABLE AS new_users FOR EACH STATEMENT EXECUTE FUNCTION users_updated();
CREATE TRIGGER users_truncated AFTER TRUNCATE ON users
  FOR EACH STATEMENT EXECUTE FUNCTION api_key_tables_truncated();
