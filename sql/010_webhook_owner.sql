-- A webhook runs on the authority of its owner, an admin: the one who
-- created it, or the admin who last re-enabled it (src/webhooks/resource.ts).
-- When the owner stops being an admin, or is deleted, the webhook is disabled
-- in the same transaction, by these triggers, so that no code path, no
-- instance and no hand-written UPDATE in psql can leave it delivering. Its
-- pending deliveries fail, as when the service disables a webhook that keeps
-- failing (src/webhooks/delivery-queries.ts), and the publisher makes no
-- delivery for a disabled webhook (src/events/publisher.ts): an event that
-- commits after the change is never delivered.
--
-- The rule that holds: a webhook that is not disabled has an admin owner.
-- The users' triggers keep it when an owner changes; webhooks_owner_holds
-- keeps it when a webhook is created or re-enabled, taking a share lock on
-- the owner's row, so that a demotion or deletion running at the same time
-- either waits for the write (and then disables what it wrote) or goes first
-- (and the write finds no admin, and stays disabled).

ALTER TABLE webhooks ADD COLUMN owner_id bigint REFERENCES users (id) ON DELETE SET NULL;
CREATE INDEX webhooks_owner_id_idx ON webhooks (owner_id);
-- Every deletion of a user looks for the webhooks it created (below): without this, a scan of them all.
CREATE INDEX webhooks_created_by_idx ON webhooks (created_by);

-- The webhook as the API shows it (src/webhooks/resource.ts, in the order of
-- its declaration), for the events written here; test/webhook-owner.test.ts
-- holds it to what GET /webhooks/{id} answers.
CREATE FUNCTION webhook_data(w webhooks) RETURNS json
LANGUAGE sql STABLE PARALLEL SAFE
RETURN json_build_object(
  'id', w.id, 'url', w.url, 'event_types', w.event_types, 'description', w.description, 'status', w.status,
  'last_error', w.last_error, 'created_by', w.created_by, 'owner_id', w.owner_id,
  'created_at', api_time(w.created_at), 'updated_at', api_time(w.updated_at));

-- The webhooks there are: owned by their creator, and disabled now if that
-- creator is gone or no longer an admin.
UPDATE webhooks SET owner_id = created_by;
WITH changed AS (
  UPDATE webhooks w SET
    status = 'disabled',
    last_error = CASE WHEN w.owner_id IS NULL THEN 'it has no owner' ELSE format('its owner (user %s) is no longer an admin', w.owner_id) END,
    version = version + 1,
    updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')
  WHERE w.status <> 'disabled' AND NOT EXISTS (SELECT 1 FROM users u WHERE u.id = w.owner_id AND u.role = 'admin')
  RETURNING *),
failed AS (
  UPDATE webhook_deliveries SET status = 'failed', leased_until = NULL, last_error = coalesce(last_error, 'the webhook was disabled')
  WHERE webhook_id IN (SELECT id FROM changed) AND status = 'pending')
INSERT INTO event_outbox (type, subject_type, subject_id, actor_credential, data)
SELECT 'webhook.updated', 'webhook', c.id, 'system', webhook_data(c) FROM changed c ORDER BY c.id;

-- Disables the webhooks of an owner who lost the authority, with the reason,
-- as the system (webhook.updated); their pending deliveries fail. A deleted
-- user leaves the webhooks it owned (disabled ones too) or created, with a
-- new version and event, rather than through the foreign keys' SET NULL,
-- which would change what GET shows without either.
CREATE FUNCTION webhooks_owner_lost(owner bigint, reason text, deleted boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
  WITH changed AS (
    UPDATE webhooks SET
      status = CASE WHEN owner_id = owner THEN 'disabled' ELSE status END,
      last_error = CASE WHEN owner_id = owner AND status <> 'disabled' THEN reason ELSE last_error END,
      owner_id = CASE WHEN deleted AND owner_id = owner THEN NULL ELSE owner_id END,
      created_by = CASE WHEN deleted AND created_by = owner THEN NULL ELSE created_by END,
      version = version + 1,
      updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')
    WHERE (owner_id = owner AND (status <> 'disabled' OR deleted)) OR (deleted AND created_by = owner)
    RETURNING *),
  failed AS (
    UPDATE webhook_deliveries SET status = 'failed', leased_until = NULL, last_error = coalesce(last_error, 'the webhook was disabled')
    WHERE webhook_id IN (SELECT id FROM changed WHERE status = 'disabled') AND status = 'pending')
  INSERT INTO event_outbox (type, subject_type, subject_id, actor_credential, data)
  SELECT 'webhook.updated', 'webhook', c.id, 'system', webhook_data(c) FROM changed c ORDER BY c.id;
END $$;

CREATE FUNCTION users_webhooks_follow_owner() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' THEN
    PERFORM webhooks_owner_lost(OLD.id, format('its owner (user %s) was deleted', OLD.id), true);
    RETURN OLD;
  END IF;
  PERFORM webhooks_owner_lost(NEW.id, format('its owner (user %s) is no longer an admin', NEW.id), false);
  RETURN NULL;
END $$;
CREATE TRIGGER users_demoted_webhooks AFTER UPDATE OF role ON users
  FOR EACH ROW WHEN (OLD.role = 'admin' AND NEW.role <> 'admin') EXECUTE FUNCTION users_webhooks_follow_owner();
-- Before the row goes: the foreign key's SET NULL would leave nothing to find the webhooks by.
CREATE TRIGGER users_deleted_webhooks BEFORE DELETE ON users
  FOR EACH ROW EXECUTE FUNCTION users_webhooks_follow_owner();

-- A webhook created, re-enabled or given another owner stays disabled unless
-- its owner is an admin (a share lock on the owner's row until commit).
CREATE FUNCTION webhooks_owner_holds() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  owner_role text;
BEGIN
  SELECT role INTO owner_role FROM users WHERE id = NEW.owner_id FOR SHARE;
  IF owner_role IS DISTINCT FROM 'admin' THEN
    NEW.status := 'disabled';
    NEW.last_error := CASE
      WHEN NEW.owner_id IS NULL THEN 'it has no owner'
      WHEN owner_role IS NULL THEN format('its owner (user %s) was deleted', NEW.owner_id)
      ELSE format('its owner (user %s) is no longer an admin', NEW.owner_id) END;
    IF owner_role IS NULL THEN NEW.owner_id := NULL; END IF;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER webhooks_owner_holds_insert BEFORE INSERT ON webhooks
  FOR EACH ROW WHEN (NEW.status <> 'disabled') EXECUTE FUNCTION webhooks_owner_holds();
CREATE TRIGGER webhooks_owner_holds_update BEFORE UPDATE OF status, owner_id ON webhooks
  FOR EACH ROW WHEN (NEW.status <> 'disabled' AND (OLD.status = 'disabled' OR OLD.owner_id IS DISTINCT FROM NEW.owner_id))
  EXECUTE FUNCTION webhooks_owner_holds();
