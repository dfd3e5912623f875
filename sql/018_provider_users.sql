-- Users of the identity provider (docs/auth.md, "Tokens from your identity
-- provider"): which users its tokens made, and the address a deleted user's
-- link leaves behind.

-- A user made from a provider token (src/auth/oidc/identities.ts), not an
-- account of ours that a token was linked to: it has no local password
-- unless OIDC_LOCAL_PASSWORDS=true (no reset is sent, a password login
-- fails as a wrong password does, none may be set), so that disabling it or
-- taking a role from it at the provider reaches every way it signs in.
ALTER TABLE users ADD COLUMN made_by_provider boolean NOT NULL DEFAULT false;

-- The users made before this column: a token made its user in the transaction
-- that made its link (both created_at are that transaction's now()), or took
-- over the link of a deleted user, which is older; a local user a token was
-- linked to existed before its link.
UPDATE users u SET made_by_provider = true FROM identities i WHERE i.user_id = u.id AND u.created_at >= i.created_at;

-- The address a linked user had when it was deleted. Without
-- OIDC_REPROVISION, no account of the provider gets a user for it again (the
-- deleted user's own subject is refused by its link already): another
-- account with the same verified address would otherwise make a fresh user
-- at once. Cleared when OIDC_REPROVISION lets a later token take the link.
ALTER TABLE identities ADD COLUMN deleted_email text,
  ADD CONSTRAINT identities_deleted_email_check CHECK (deleted_email IS NULL OR user_id IS NULL);
CREATE INDEX identities_deleted_email_idx ON identities (issuer, lower(deleted_email))
  WHERE deleted_email IS NOT NULL;

-- Before the row goes, what ON DELETE SET NULL would do after it (when the
-- address is no longer there to read), with the address; the trigger of
-- sql/014 stamps user_deleted_at as before.
CREATE FUNCTION users_deleted_identities() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  UPDATE identities SET user_id = NULL, deleted_email = OLD.email WHERE user_id = OLD.id;
  RETURN OLD;
END $$;
CREATE TRIGGER users_deleted_identities BEFORE DELETE ON users
  FOR EACH ROW EXECUTE FUNCTION users_deleted_identities();

-- Sessions a password opened for a user made from tokens (only a password
-- reset before this rule could give it one) end now, as
-- OIDC_LOCAL_PASSWORDS=false, the default, wants: they hold the role the
-- provider last gave and would not hear it change. With
-- OIDC_LOCAL_PASSWORDS=true such a user logs in again once.
UPDATE sessions SET revoked_at = now()
WHERE revoked_at IS NULL AND user_id IN (SELECT id FROM users WHERE made_by_provider);
