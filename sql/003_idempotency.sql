-- Idempotency-Key records (draft-ietf-httpapi-idempotency-key-header): the
-- first answer to a creating POST, replayed to retries for 24 hours. A row
-- with status NULL is a request still running. Kept in PostgreSQL so that
-- every instance sees every key; expired rows are deleted as new ones arrive.
CREATE TABLE idempotency_keys (
  caller       text NOT NULL,
  key          text NOT NULL,
  fingerprint  text NOT NULL,
  status       integer,
  headers      jsonb,
  body         text,
  created_at   timestamptz(3) NOT NULL DEFAULT now(),
  PRIMARY KEY (caller, key)
);
CREATE INDEX idempotency_keys_created_at_idx ON idempotency_keys (created_at);
