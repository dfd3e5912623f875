-- Failed logins counted per (account, client address), and per account alone
-- with address '*' and a much higher ceiling (src/auth/login-throttle.ts):
-- failures from one address no longer lock the account for its owner at
-- another. Counts under the old key are dropped: they only ever delay.
DROP TABLE login_failures;
CREATE TABLE login_failures (
  email         text NOT NULL,
  address       text NOT NULL CHECK (char_length(address) BETWEEN 1 AND 64),
  failures      integer NOT NULL,
  last_failure  timestamptz(3) NOT NULL,
  locked_until  timestamptz(3),
  PRIMARY KEY (email, address)
);
-- For the purge of rows whose window has passed.
CREATE INDEX login_failures_last_failure_idx ON login_failures (last_failure);
