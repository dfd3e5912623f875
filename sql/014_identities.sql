-- Users of the identity provider (OIDC_ISSUER, docs/auth.md "Tokens from your
-- identity provider"): which local user each of its accounts (issuer,
-- subject) is. A provider token carries no session and no epoch of ours, so
-- what withdraws access is told by time: a token issued before the withdrawal
-- is refused (src/auth/oidc/identities.ts).

-- When credential_epoch was last raised (logout everywhere, a password or role
-- change): every provider token of the user issued at or before it is void.
-- Never for users that predate this migration: -infinity.
ALTER TABLE users ADD COLUMN credential_epoch_at timestamptz(3) NOT NULL DEFAULT '-infinity';

-- The trigger of sql/005, which raises the epoch on a role or password change,
-- now also stamps the time of every raise, whoever raised it. A statement
-- that sets credential_epoch_at itself keeps its value: a role taken from a
-- provider token voids that provider's older tokens, not the one carrying it.
CREATE OR REPLACE FUNCTION users_bump_credential_epoch() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.role IS DISTINCT FROM OLD.role OR NEW.password_hash IS DISTINCT FROM OLD.password_hash THEN
    NEW.credential_epoch := greatest(NEW.credential_epoch, OLD.credential_epoch + 1);
  END IF;
  -- The clock, not now(): the start of a long transaction would let the tokens issued during it through.
  IF NEW.credential_epoch > OLD.credential_epoch AND NEW.credential_epoch_at IS NOT DISTINCT FROM OLD.credential_epoch_at THEN
    NEW.credential_epoch_at := clock_timestamp();
  END IF;
  RETURN NEW;
END $$;

CREATE TABLE identities (
  issuer           text NOT NULL CHECK (char_length(issuer) BETWEEN 1 AND 1000),
  subject          text NOT NULL CHECK (char_length(subject) BETWEEN 1 AND 255),
  -- Null once the user is deleted: the row stays, so that the provider's
  -- tokens issued before the deletion stay refused, and a later one creates
  -- the user again only with OIDC_REPROVISION=true.
  user_id          bigint REFERENCES users (id) ON DELETE SET NULL,
  created_at       timestamptz(3) NOT NULL DEFAULT now(),
  user_deleted_at  timestamptz(3),
  PRIMARY KEY (issuer, subject),
  CHECK ((user_id IS NULL) = (user_deleted_at IS NOT NULL))
);
-- One account of a provider per local user: a second account with the same
-- verified address does not take over the first one's user.
CREATE UNIQUE INDEX identities_issuer_user_id_key ON identities (issuer, user_id);
-- ON DELETE SET NULL looks rows up by user_id.
CREATE INDEX identities_user_id_idx ON identities (user_id) WHERE user_id IS NOT NULL;

CREATE FUNCTION identities_user_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.user_id IS NULL AND OLD.user_id IS NOT NULL THEN
    NEW.user_deleted_at := clock_timestamp();
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER identities_user_deleted BEFORE UPDATE OF user_id ON identities
  FOR EACH ROW EXECUTE FUNCTION identities_user_deleted();

-- Events name the credential that made a change; a provider token is 'oidc'.
ALTER TABLE event_outbox DROP CONSTRAINT event_outbox_actor_credential_check;
ALTER TABLE event_outbox ADD CONSTRAINT event_outbox_actor_credential_check
  CHECK (actor_credential IN ('jwt', 'token', 'api_key', 'oidc', 'password', 'refresh_token', 'system'));
