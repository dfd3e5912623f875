-- Account recovery (docs/auth.md, "Account recovery: rules"): verified
-- addresses, one-time tokens for password resets and address verification,
-- and the mail outbox their messages wait in until a worker has sent them
-- (src/mail/worker.ts).

-- When the address was last proved to reach the user; null until then.
-- Users that exist before this migration were never asked: null. With
-- REQUIRE_VERIFIED_EMAIL=true their next password login answers 403
-- email_not_verified and sends them a verification link.
ALTER TABLE users ADD COLUMN email_verified_at timestamptz(3);

-- An address that changes is no longer verified, whatever path changed it
-- (the API, the admin command, psql): the proof was for the old one. Only
-- letter case ignored, as the unique index on lower(email) ignores it.
CREATE FUNCTION users_email_unverified() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF lower(NEW.email) IS DISTINCT FROM lower(OLD.email) THEN
    NEW.email_verified_at := NULL;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER users_email_unverified BEFORE UPDATE OF email ON users
  FOR EACH ROW EXECUTE FUNCTION users_email_unverified();

-- Single-use tokens: only the SHA-256 of the secret (32 random bytes) is
-- kept. A row stays after use or expiry for an hour at least, so that the
-- messages of the last hour can be counted per account, then is purged.
CREATE TABLE one_time_tokens (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  purpose     text NOT NULL CHECK (purpose IN ('password_reset', 'verify_email')),
  user_id     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  token_hash  bytea NOT NULL UNIQUE CHECK (octet_length(token_hash) = 32),
  -- The address a verify_email token proves; it verifies nothing once the user's address is another.
  email       text CHECK ((purpose = 'verify_email') = (email IS NOT NULL) AND char_length(email) <= 254),
  created_at  timestamptz(3) NOT NULL DEFAULT now(),
  expires_at  timestamptz(3) NOT NULL,
  used_at     timestamptz(3)
);
-- The per-account count of the last hour, and retiring a user's open tokens.
CREATE INDEX one_time_tokens_user_idx ON one_time_tokens (user_id, purpose, created_at);
CREATE INDEX one_time_tokens_expires_at_idx ON one_time_tokens (expires_at);

-- Every password-reset request, for an account or not: the per-address
-- count of the last hour (at most 5 messages), and a write that a request
-- for an unknown address makes as much as one for a known address (the
-- commit of a write waits for the WAL flush, a read-only statement does not:
-- without it, the time of the answer would tell). The address as the
-- SHA-256 of its normalized form; rows older than an hour are purged.
CREATE TABLE password_reset_requests (
  email_hash    bytea NOT NULL CHECK (octet_length(email_hash) = 32),
  requested_at  timestamptz(3) NOT NULL DEFAULT now()
);
CREATE INDEX password_reset_requests_idx ON password_reset_requests (email_hash, requested_at);
CREATE INDEX password_reset_requests_at_idx ON password_reset_requests (requested_at);

-- Messages waiting to be sent (src/mail/message.ts has their fields). The
-- text and the link hold a one-time token, a secret: a row goes once its
-- message is sent, and what a failure leaves (last_error) is the
-- transport's word, never the message.
CREATE TABLE mail_outbox (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  type             text NOT NULL CHECK (type IN ('mail.password_reset', 'mail.verify_email', 'mail.email_changed')),
  user_id          bigint REFERENCES users (id) ON DELETE SET NULL,
  recipient        text NOT NULL CHECK (char_length(recipient) <= 254),
  subject          text NOT NULL CHECK (char_length(subject) <= 200),
  body             text NOT NULL CHECK (char_length(body) <= 10000),
  link             text CHECK (char_length(link) <= 2000),
  created_at       timestamptz(3) NOT NULL DEFAULT now(),
  attempts         integer NOT NULL DEFAULT 0,
  -- Due for an attempt from then on; a claim moves it past its lease.
  next_attempt_at  timestamptz(3) NOT NULL DEFAULT now(),
  last_error       text CHECK (char_length(last_error) <= 500),
  -- Set when the transport refused it for good or the retries ran out; the row stays, scrubbed, for the operator.
  failed_at        timestamptz(3)
);
CREATE INDEX mail_outbox_due_idx ON mail_outbox (next_attempt_at) WHERE failed_at IS NULL;

-- Wakes every instance's mail worker at commit (src/mail/worker.ts); the
-- table is the truth, so a wake-up lost is only a delay until the next poll.
CREATE FUNCTION mail_outbox_wake() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM new_mail) THEN PERFORM pg_notify('mail_outbox', ''); END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER mail_outbox_wake AFTER INSERT ON mail_outbox
  REFERENCING NEW TABLE AS new_mail FOR EACH STATEMENT EXECUTE FUNCTION mail_outbox_wake();
