-- Addresses that proved an account's password (src/auth/known-addresses.ts):
-- the account-wide failure count that other addresses drive up does not
-- lock them out. The address is a keyed hash of its throttle bucket (IPv6
-- per /64), never the address itself; a row counts while `epoch` is its
-- user's credential_epoch and for 30 days after `last_success_at`, then the
-- service purges it in batches.
CREATE TABLE login_known_addresses (
  user_id          bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
  address_tag      bytea NOT NULL CHECK (octet_length(address_tag) = 32),
  epoch            integer NOT NULL,
  last_success_at  timestamptz(3) NOT NULL,
  PRIMARY KEY (user_id, address_tag)
);
-- For the purge of rows older than 30 days.
CREATE INDEX login_known_addresses_last_success_at_idx ON login_known_addresses (last_success_at);
