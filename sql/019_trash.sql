-- The trash (docs/api.md, "Trash"): a DELETE of a user or a product sets
-- deleted_at instead of removing the row; reads, lists and writes see live
-- rows only (deleted_at IS NULL), POST …/restore clears it, and the service
-- purges what has been in the trash for TRASH_RETENTION seconds
-- (src/core/resources/trash-purge.ts), or at once on DELETE ?permanent=true.
ALTER TABLE users ADD COLUMN deleted_at timestamptz(3);
ALTER TABLE products ADD COLUMN deleted_at timestamptz(3);

-- Unique among live rows only: a trashed row leaves its address or SKU free.
-- The same names as before, which the declarations give their 409 codes by.
DROP INDEX users_email_key;
CREATE UNIQUE INDEX users_email_key ON users (lower(email)) WHERE deleted_at IS NULL;
ALTER TABLE products DROP CONSTRAINT products_sku_key;
CREATE UNIQUE INDEX products_sku_key ON products (sku) WHERE deleted_at IS NULL;

-- The purge's scan of what is due, and the lookups of trashed users by address (the erasure at the purge, and the
-- identity provider's rule on a deleted user's address).
CREATE INDEX users_deleted_at_idx ON users (deleted_at) WHERE deleted_at IS NOT NULL;
CREATE INDEX users_trashed_email_idx ON users (lower(email)) WHERE deleted_at IS NOT NULL;
CREATE INDEX products_deleted_at_idx ON products (deleted_at) WHERE deleted_at IS NOT NULL;

-- A user moved to the trash loses, in the transaction of the move and
-- whatever path moved it, every credential and grant that the removal of its
-- row ended through foreign keys and triggers (sql/002, 004, 005, 010, 011,
-- 012, 016), so that every instance stops honouring them at once; a restore
-- brings none of them back:
-- - its credential epoch is raised (and stamped, sql/014): every JWT of it,
--   and every provider token issued before, is void; the trigger of sql/005
--   records and announces it, and login-step challenges and known addresses,
--   bound to the epoch, lapse;
-- - its sessions end (their refresh and opaque tokens with them, and the JWTs
--   naming them, sql/005);
-- - its API keys go (sql/004 tells every instance's cache);
-- - its one-time links (password reset, verification, e-mail restore) are spent;
-- - the webhooks it owned are disabled and it is no longer their owner or
--   creator (sql/010), as on a deletion;
-- - its provider links are left as a deletion leaves them (sql/014, 018:
--   no user, the time, the address no other account of the provider gets),
--   remembering the user (trashed_user_id) for a restore.
-- Its row and its second factor stay until the purge.
ALTER TABLE identities ADD COLUMN trashed_user_id bigint REFERENCES users (id) ON DELETE SET NULL,
  ADD CONSTRAINT identities_trashed_user_id_check CHECK (trashed_user_id IS NULL OR user_id IS NULL);
CREATE INDEX identities_trashed_user_id_idx ON identities (trashed_user_id) WHERE trashed_user_id IS NOT NULL;

CREATE FUNCTION users_trashed_epoch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  NEW.credential_epoch := greatest(NEW.credential_epoch, OLD.credential_epoch + 1);
  -- The clock, not now(), as in sql/014: the start of a long transaction would let tokens issued during it through.
  NEW.credential_epoch_at := clock_timestamp();
  RETURN NEW;
END $$;
CREATE TRIGGER users_trashed_epoch BEFORE UPDATE OF deleted_at ON users
  FOR EACH ROW WHEN (OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL) EXECUTE FUNCTION users_trashed_epoch();

CREATE FUNCTION users_trashed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE sessions SET revoked_at = now() WHERE user_id = NEW.id AND revoked_at IS NULL;
  DELETE FROM api_keys WHERE user_id = NEW.id;
  -- As the removal of the row announced it (sql/004): every cached key of the user goes.
  PERFORM announce_api_key_change('users', ARRAY[NEW.id]);
  UPDATE one_time_tokens SET used_at = now() WHERE user_id = NEW.id AND used_at IS NULL;
  DELETE FROM mfa_challenges WHERE user_id = NEW.id;
  DELETE FROM login_known_addresses WHERE user_id = NEW.id;
  PERFORM webhooks_owner_lost(NEW.id, format('its owner (user %s) was deleted', NEW.id), true);
  UPDATE identities SET user_id = NULL, deleted_email = NEW.email, trashed_user_id = NEW.id WHERE user_id = NEW.id;
  RETURN NULL;
END $$;
CREATE TRIGGER users_trashed AFTER UPDATE OF deleted_at ON users
  FOR EACH ROW WHEN (OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL) EXECUTE FUNCTION users_trashed();

-- A restore links the user's provider accounts again, unless a token took a
-- link over meanwhile (OIDC_REPROVISION); the provider's tokens issued before
-- the deletion stay refused (its epoch was stamped then).
CREATE FUNCTION users_restored() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE identities SET user_id = NEW.id, user_deleted_at = NULL, deleted_email = NULL, trashed_user_id = NULL
  WHERE trashed_user_id = NEW.id AND user_id IS NULL;
  RETURN NULL;
END $$;
CREATE TRIGGER users_restored AFTER UPDATE OF deleted_at ON users
  FOR EACH ROW WHEN (OLD.deleted_at IS NOT NULL AND NEW.deleted_at IS NULL) EXECUTE FUNCTION users_restored();

-- A webhook created or re-enabled stays disabled unless its owner is a live
-- admin: a trashed owner is a deleted one (the rule of sql/010, whose share
-- lock orders it against the move to the trash).
CREATE OR REPLACE FUNCTION webhooks_owner_holds() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
  owner_role text;
BEGIN
  SELECT CASE WHEN deleted_at IS NULL THEN role END INTO owner_role FROM users WHERE id = NEW.owner_id FOR SHARE;
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

-- The purge erases a user (docs/security.md, "Erasure"): its provider link
-- stays, so that the provider's tokens issued before stay refused, but
-- without the address that sql/018 kept there (for a user purged from the
-- trash, the purge's hook clears it, src/users/erasure.ts).
CREATE OR REPLACE FUNCTION users_deleted_identities() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE identities SET user_id = NULL WHERE user_id = OLD.id;
  RETURN OLD;
END $$;
