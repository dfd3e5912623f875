-- Putting an address back (docs/auth.md, "Account recovery: rules"): the
-- notice an address change sends to the old address carries a link that
-- restores that address and ends every credential of the account. Its secret
-- is a one-time token like the others (only its SHA-256 is kept), of a
-- purpose of its own, and it holds the address it restores, as a
-- verification token holds the address it proves.
ALTER TABLE one_time_tokens
  DROP CONSTRAINT one_time_tokens_purpose_check,
  ADD CONSTRAINT one_time_tokens_purpose_check
    CHECK (purpose IN ('password_reset', 'verify_email', 'email_restore')),
  -- The constraint of sql/012 on purpose and email (named by PostgreSQL), under a name that says what it checks.
  DROP CONSTRAINT one_time_tokens_check,
  ADD CONSTRAINT one_time_tokens_email_check
    CHECK ((purpose IN ('verify_email', 'email_restore')) = (email IS NOT NULL) AND char_length(email) <= 254);
