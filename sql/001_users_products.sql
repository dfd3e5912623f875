-- Users and products. Timestamps keep milliseconds only (timestamptz(3)): that
-- is what the API shows, and a keyset cursor must carry the exact stored value.
-- `version` counts writes of a row; it is the ETag and the If-Match check.

CREATE TABLE users (
  id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  name          text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
  email         text NOT NULL CHECK (char_length(email) BETWEEN 3 AND 254),
  role          text NOT NULL DEFAULT 'user' CHECK (role IN ('admin', 'user')),
  password_hash text,
  version       integer NOT NULL DEFAULT 1,
  created_at    timestamptz(3) NOT NULL DEFAULT now(),
  updated_at    timestamptz(3) NOT NULL DEFAULT now()
);

-- E-mail addresses are unique without regard to case; the name is what
-- src/core/db/errors.ts maps to 409 email_taken.
CREATE UNIQUE INDEX users_email_key ON users (lower(email));

-- One index per sortable member, ending in id: every allowed sort (ascending,
-- or descending by a backward scan) and its keyset condition is an index scan.
CREATE INDEX users_name_id_idx ON users (name, id);
CREATE INDEX users_email_id_idx ON users (email, id);
CREATE INDEX users_role_id_idx ON users (role, id);
CREATE INDEX users_created_at_id_idx ON users (created_at, id);
CREATE INDEX users_updated_at_id_idx ON users (updated_at, id);

CREATE TABLE products (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  sku         text NOT NULL CHECK (sku ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
  name        text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
  description text NOT NULL DEFAULT '' CHECK (char_length(description) <= 10000),
  price       bigint NOT NULL CHECK (price BETWEEN 0 AND 1000000000000),
  currency    text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
  stock       integer NOT NULL DEFAULT 0 CHECK (stock >= 0),
  version     integer NOT NULL DEFAULT 1,
  created_at  timestamptz(3) NOT NULL DEFAULT now(),
  updated_at  timestamptz(3) NOT NULL DEFAULT now(),
  CONSTRAINT products_sku_key UNIQUE (sku)
);

CREATE INDEX products_sku_id_idx ON products (sku, id);
CREATE INDEX products_name_id_idx ON products (name, id);
CREATE INDEX products_price_id_idx ON products (price, id);
CREATE INDEX products_currency_id_idx ON products (currency, id);
CREATE INDEX products_stock_id_idx ON products (stock, id);
CREATE INDEX products_created_at_id_idx ON products (created_at, id);
CREATE INDEX products_updated_at_id_idx ON products (updated_at, id);
