-- Deleting a user sets mail_outbox.user_id to null (ON DELETE SET NULL): without
-- an index on the column that is a scan of the whole outbox, which keeps given-up
-- rows for a week.
CREATE INDEX mail_outbox_user_id ON mail_outbox (user_id) WHERE user_id IS NOT NULL;
