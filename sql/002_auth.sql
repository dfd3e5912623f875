-- Credentials. Every secret is stored only as its SHA-256 (bytea); rows go
-- with their user (ON DELETE CASCADE), in the same statement as the user.

-- A login session: what a refresh token family and its access tokens belong to.
CREATE TABLE sessions (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  user_id     bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  scopes      text[] NOT NULL,
  token_format text NOT NULL CHECK (token_format IN ('jwt', 'opaque')),
  created_at  timestamptz(3) NOT NULL DEFAULT now(),
  expires_at  timestamptz(3) NOT NULL,
  revoked_at  timestamptz(3)
);
CREATE INDEX sessions_user_id_idx ON sessions (user_id);

-- Refresh tokens rotate: each use retires the token (used_at) and issues the
-- next. A retired token presented again means it leaked: the session is revoked.
CREATE TABLE refresh_tokens (
  token_hash  bytea PRIMARY KEY,
  session_id  bigint NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
  created_at  timestamptz(3) NOT NULL DEFAULT now(),
  used_at     timestamptz(3)
);
CREATE INDEX refresh_tokens_session_id_idx ON refresh_tokens (session_id);

-- Opaque access tokens (token_format "opaque"): revocable at once.
CREATE TABLE access_tokens (
  token_hash  bytea PRIMARY KEY,
  session_id  bigint NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
  expires_at  timestamptz(3) NOT NULL
);
CREATE INDEX access_tokens_session_id_idx ON access_tokens (session_id);

CREATE TABLE api_keys (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  user_id       bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  name          text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
  prefix        text NOT NULL,
  key_hash      bytea NOT NULL UNIQUE,
  scopes        text[] NOT NULL,
  created_at    timestamptz(3) NOT NULL DEFAULT now(),
  expires_at    timestamptz(3),
  last_used_at  timestamptz(3)
);
CREATE INDEX api_keys_user_id_id_idx ON api_keys (user_id, id);

-- Failed logins per e-mail address (lower-cased), known account or not, so
-- that throttling holds across instances and says nothing about existence.
CREATE TABLE login_failures (
  email         text PRIMARY KEY,
  failures      integer NOT NULL,
  last_failure  timestamptz(3) NOT NULL,
  locked_until  timestamptz(3)
);
