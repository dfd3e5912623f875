-- One lock order for webhooks and their deliveries, so that no two
-- transactions wait on each other in a cycle (PostgreSQL would abort one of
-- them, and that one may be a client's PATCH /users/{id}):
--
--   a user's row, then webhook rows, then delivery rows; within a table,
--   lowest id first; and a row already held is not locked again in a
--   stronger mode.
--
-- src/webhooks/delivery-queries.ts lists the paths and how each keeps it.
-- The owner's triggers (sql/010) locked the webhooks and then the deliveries
-- in the order of their scans, in one statement whose parts PostgreSQL does
-- not promise to run in any order. Here they lock the webhooks in id order,
-- then, in a statement of their own, fail the pending deliveries of those
-- disabled in id order, with the function the worker calls too when it
-- disables a webhook that keeps failing.

CREATE FUNCTION fail_pending_deliveries(webhook_ids bigint[]) RETURNS void
LANGUAGE sql
BEGIN ATOMIC
  UPDATE webhook_deliveries SET status = 'failed', leased_until = NULL, last_error = coalesce(last_error, 'the webhook was disabled')
  WHERE id IN (
    SELECT id FROM webhook_deliveries WHERE webhook_id = ANY (webhook_ids) AND status = 'pending'
    ORDER BY id FOR NO KEY UPDATE);
END;

CREATE OR REPLACE FUNCTION webhooks_owner_lost(owner bigint, reason text, deleted boolean) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  disabled bigint[];
BEGIN
  WITH locked AS (
    SELECT id FROM webhooks
    WHERE (owner_id = owner AND (status <> 'disabled' OR deleted)) OR (deleted AND created_by = owner)
    ORDER BY id FOR NO KEY UPDATE),
  changed AS (
    UPDATE webhooks SET
      status = CASE WHEN owner_id = owner THEN 'disabled' ELSE status END,
      last_error = CASE WHEN owner_id = owner AND status <> 'disabled' THEN reason ELSE last_error END,
      owner_id = CASE WHEN deleted AND owner_id = owner THEN NULL ELSE owner_id END,
      created_by = CASE WHEN deleted AND created_by = owner THEN NULL ELSE created_by END,
      version = version + 1,
      updated_at = greatest(clock_timestamp(), updated_at + interval '1 millisecond')
    WHERE id IN (SELECT id FROM locked)
    RETURNING *),
  announced AS (
    INSERT INTO event_outbox (type, subject_type, subject_id, actor_credential, data)
    SELECT 'webhook.updated', 'webhook', c.id, 'system', webhook_data(c) FROM changed c ORDER BY c.id)
  SELECT array_agg(id) FILTER (WHERE status = 'disabled') INTO disabled FROM changed;
  PERFORM fail_pending_deliveries(disabled);
END $$;
