-- A second factor and step-up (docs/auth.md, "Second factor" and "Step-up").

-- A user's TOTP factor (RFC 6238). The secret is sealed (AES-256-GCM under a
-- key derived from the first JWT secret, src/core/lib/sealed-text.ts): the
-- service needs it back to compute codes, so a hash will not do. A row with
-- confirmed_at null is an enrolment waiting for its first code; last_step is
-- the last 30-second step a code was accepted for, so each is accepted once.
CREATE TABLE totp_factors (
  user_id        bigint PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
  secret_sealed  text NOT NULL,
  last_step      bigint NOT NULL DEFAULT 0,
  created_at     timestamptz(3) NOT NULL DEFAULT now(),
  confirmed_at   timestamptz(3)
);

-- Single-use recovery codes, shown once: only their SHA-256 is kept (each is
-- 50 random bits, so a fast hash is right, as for tokens).
CREATE TABLE recovery_codes (
  user_id    bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  code_hash  bytea NOT NULL CHECK (octet_length(code_hash) = 32),
  used_at    timestamptz(3),
  PRIMARY KEY (user_id, code_hash)
);

-- The second step of a login: a password proved, a code still due. Bound to
-- that login (its scopes and token format) and to the user's credential
-- epoch, so a password or role change in between voids it; single use, and
-- purged once expired.
CREATE TABLE mfa_challenges (
  token_hash        bytea PRIMARY KEY CHECK (octet_length(token_hash) = 32),
  user_id           bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  credential_epoch  integer NOT NULL,
  scopes            text[] NOT NULL,
  token_format      text NOT NULL CHECK (token_format IN ('jwt', 'opaque')),
  expires_at        timestamptz(3) NOT NULL,
  used_at           timestamptz(3)
);
CREATE INDEX mfa_challenges_expires_at_idx ON mfa_challenges (expires_at);
CREATE INDEX mfa_challenges_user_id_idx ON mfa_challenges (user_id);

-- How a session's login proved its user (RFC 8176 method names: pwd, otp);
-- the session's created_at is when.
ALTER TABLE sessions ADD COLUMN amr text[] NOT NULL DEFAULT '{pwd}';

-- An API key made on the strength of a recent login (no password in its own
-- request) lives no longer than that login's session: ending the session
-- revokes it (src/auth/sessions/sessions.ts). Null for a key made with the
-- password in the request.
ALTER TABLE api_keys ADD COLUMN session_id bigint REFERENCES sessions (id) ON DELETE CASCADE;
CREATE INDEX api_keys_session_id_idx ON api_keys (session_id) WHERE session_id IS NOT NULL;
