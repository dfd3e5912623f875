-- Events: every change of state, written in the transaction of the change
-- to the outbox, published from there to the event log (GET /events),
-- followed live (GET /events/stream) and delivered to webhooks.
--
-- Commit order. A sequence value taken when a row is inserted does not follow
-- commit order: a transaction that took 7 may commit after the one that took
-- 8, and a reader that saw 8 and moved its cursor past it would never see 7.
-- Numbering at commit under a lock would follow it, but a lock held to the
-- end of a commit is held across its WAL flush, and every write would wait
-- for every other's flush (measured: 1,700 writes/s fell to 250).
--
-- So a write puts its event in event_outbox, a small table with no index but
-- its key, and the publisher (src/events/publisher.ts) moves committed rows
-- from there to `events` in batches, numbering them as it goes: in the order
-- they were written within a batch, batch after batch. A batch runs under a
-- transaction-level advisory lock, so batches (from any instance) follow one
-- another and each commits before the next draws ids. An event is published
-- only once its transaction has committed, so when an event is visible,
-- every event with a smaller id that will ever exist is visible too, and a
-- reader's cursor never skips one. Two writes to the same row are published
-- in the order they committed: the second's event is written after the
-- first committed.

CREATE TABLE event_outbox (
  seq               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  -- `subject.verb`; a resource declared later brings its own types.
  type              text NOT NULL CHECK (type ~ '^[a-z_]{1,40}\.[a-z_]{1,40}$'),
  occurred_at       timestamptz(3) NOT NULL DEFAULT clock_timestamp(),
  subject_type      text NOT NULL CHECK (subject_type ~ '^[a-z_]{1,40}$'),
  subject_id        bigint,
  -- Who did it: a user and the kind of credential used; none for a change
  -- made by the service itself (the first admin) or by an anonymous caller.
  actor_id          bigint,
  actor_credential  text CHECK (actor_credential IN ('jwt', 'token', 'api_key', 'password', 'refresh_token', 'system')),
  request_id        text CHECK (char_length(request_id) <= 128),
  -- The subject after the change (before it, for a deletion), as the API
  -- shows it: never a password hash, a key or a token.
  data              json NOT NULL
);

CREATE SEQUENCE events_id_seq;

-- The published events; rows arrive from the outbox as they are.
CREATE TABLE events (
  id                bigint PRIMARY KEY,
  type              text NOT NULL,
  occurred_at       timestamptz(3) NOT NULL,
  subject_type      text NOT NULL,
  subject_id        bigint,
  actor_id          bigint,
  actor_credential  text,
  request_id        text,
  data              json NOT NULL
);
-- The feed's filters, each in commit order.
CREATE INDEX events_subject_idx ON events (subject_type, subject_id, id);
CREATE INDEX events_actor_idx ON events (actor_id, id) WHERE actor_id IS NOT NULL;
CREATE INDEX events_type_idx ON events (type, id);
-- occurred_at grows with the id: a block-range index serves time filters and
-- retention for almost nothing per insert.
CREATE INDEX events_occurred_at_idx ON events USING brin (occurred_at);

-- GET /events reads this: subject and actor as the objects the API shows,
-- and the columns its filters use.
CREATE VIEW event_feed AS
SELECT id, type, occurred_at,
  json_build_object('type', subject_type, 'id', subject_id) AS subject,
  json_build_object('user_id', actor_id, 'credential', actor_credential) AS actor,
  request_id, data, subject_type, subject_id, actor_id
FROM events;

-- The API's timestamp text ("2026-11-22T10:15:30.120Z"), for event data
-- built in SQL in the statement of the change (src/events/representation.ts).
CREATE FUNCTION api_time(t timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"');

-- A session as its events show it (session.created, session.revoked): who,
-- from where, until when; never a token.
CREATE FUNCTION session_data(s sessions) RETURNS json
LANGUAGE sql STABLE PARALLEL SAFE
RETURN json_build_object(
  'id', s.id, 'user_id', s.user_id, 'scopes', s.scopes, 'token_format', s.token_format,
  'created_at', api_time(s.created_at), 'expires_at', api_time(s.expires_at), 'revoked_at', api_time(s.revoked_at),
  'user_agent', s.user_agent, 'client_address', s.client_address);

-- Webhook subscriptions (src/webhooks/resource.ts). The signing secret must
-- be read to sign, so it cannot be stored as a hash: it is stored sealed
-- (AES-256-GCM under a key derived from a JWT secret, src/webhooks/secret.ts),
-- so a copy of the database alone does not reveal it.
CREATE TABLE webhooks (
  id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  url             text NOT NULL CHECK (char_length(url) BETWEEN 1 AND 2048),
  event_types     text[] NOT NULL CHECK (cardinality(event_types) BETWEEN 1 AND 50),
  description     text NOT NULL DEFAULT '' CHECK (char_length(description) <= 500),
  -- active: delivered; paused: by an admin, deliveries wait; disabled: by the
  -- service after failing for a day (last_error says why), its deliveries failed.
  status          text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'paused', 'disabled')),
  secret_sealed   text NOT NULL,
  -- After a rotation that keeps the old secret for a while, it signs too until then.
  previous_secret_sealed      text,
  previous_secret_expires_at  timestamptz(3),
  -- Since when every attempt has failed (NULL after a success); not shown, so
  -- that failures do not change the representation (and its ETag) each time.
  failing_since   timestamptz(3),
  last_error      text,
  created_by      bigint REFERENCES users (id) ON DELETE SET NULL,
  created_at      timestamptz(3) NOT NULL DEFAULT now(),
  updated_at      timestamptz(3) NOT NULL DEFAULT now(),
  version         integer NOT NULL DEFAULT 1
);
CREATE INDEX webhooks_status_idx ON webhooks (status, id);
CREATE INDEX webhooks_created_at_idx ON webhooks (created_at, id);
CREATE INDEX webhooks_updated_at_idx ON webhooks (updated_at, id);

-- One per event and subscription that wants it, made as the event is published (src/events/publisher.ts).
CREATE TABLE webhook_deliveries (
  id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  webhook_id       bigint NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
  event_id         bigint NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  -- pending: due at next_attempt_at (a claim moves it forward by the lease,
  -- so a worker that dies mid-send hands it on); succeeded; failed: retries
  -- exhausted or the subscription disabled.
  status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'succeeded', 'failed')),
  -- Attempts claimed so far; also the claim's fencing token: a worker records
  -- its outcome only if no later claim has taken the delivery since.
  attempts         integer NOT NULL DEFAULT 0,
  next_attempt_at  timestamptz(3) NOT NULL DEFAULT now(),
  -- Set by a claim, cleared when its outcome is recorded: while it is in the
  -- future an attempt is in flight, and a manual retry leaves the delivery to it.
  leased_until     timestamptz(3),
  created_at       timestamptz(3) NOT NULL DEFAULT now(),
  last_attempt_at  timestamptz(3),
  last_status      integer,
  last_error       text
);
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_webhook_idx ON webhook_deliveries (webhook_id, id);
CREATE INDEX webhook_deliveries_event_idx ON webhook_deliveries (event_id);

-- Every attempt: what the receiver answered (or why there was no answer).
CREATE TABLE webhook_attempts (
  id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  delivery_id     bigint NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
  attempted_at    timestamptz(3) NOT NULL DEFAULT now(),
  status          integer,
  duration_ms     integer NOT NULL,
  error           text CHECK (char_length(error) <= 1000)
);
CREATE INDEX webhook_attempts_delivery_idx ON webhook_attempts (delivery_id, id);

-- GET /webhooks/{id}/deliveries reads this (src/webhooks/deliveries.ts): a
-- delivery, its event's type and its latest attempts, newest first, with
-- timestamps in the API's text.
CREATE VIEW webhook_delivery_feed AS
SELECT d.id, d.webhook_id, d.event_id, e.type AS event_type, d.status, d.attempts AS attempt_count, d.created_at,
  CASE WHEN d.status = 'pending' THEN d.next_attempt_at END AS next_attempt_at,
  d.last_attempt_at, d.last_status, d.last_error,
  (SELECT coalesce(json_agg(json_build_object(
      'attempted_at', api_time(a.attempted_at), 'status', a.status, 'duration_ms', a.duration_ms, 'error', a.error) ORDER BY a.id DESC), '[]')
    FROM (SELECT * FROM webhook_attempts WHERE delivery_id = d.id ORDER BY id DESC LIMIT 50) a) AS attempts
FROM webhook_deliveries d JOIN events e ON e.id = d.event_id;
