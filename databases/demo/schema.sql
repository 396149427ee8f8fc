-- The demo database: "bookshop", a small European chain of bookshops that also sells online.
--
-- Conventions (kept simple on purpose: a small LLM writes SQL against this schema):
--   * every table has an integer primary key named <singular>_id;
--   * dates are TEXT 'YYYY-MM-DD' (declared DATE), so they compare correctly as strings
--     on SQLite and on the DuckDB copy alike;
--   * money is REAL in euros; NULL means "not known / does not apply", never 0.
-- Tables are listed in dependency order: each one only references tables above it.

CREATE TABLE stores (
    store_id      INTEGER PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    city          TEXT NOT NULL,
    country       TEXT NOT NULL,
    opened_date   DATE NOT NULL,
    floor_area_m2 INTEGER NOT NULL
);

CREATE TABLE employees (
    employee_id INTEGER PRIMARY KEY,
    first_name  TEXT NOT NULL,
    last_name   TEXT NOT NULL,
    store_id    INTEGER NOT NULL REFERENCES stores (store_id),
    role        TEXT NOT NULL,              -- 'Store Manager', 'Assistant Manager', 'Bookseller', 'Cashier'
    hire_date   DATE NOT NULL,
    salary      REAL NOT NULL,              -- yearly, euros
    manager_id  INTEGER REFERENCES employees (employee_id)  -- NULL for store managers
);

CREATE TABLE authors (
    author_id  INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    country    TEXT NOT NULL,
    birth_year INTEGER                      -- NULL when unknown
);

CREATE TABLE books (
    book_id        INTEGER PRIMARY KEY,
    title          TEXT NOT NULL UNIQUE,
    author_id      INTEGER NOT NULL REFERENCES authors (author_id),
    genre          TEXT NOT NULL,
    language       TEXT NOT NULL,
    published_year INTEGER NOT NULL,
    pages          INTEGER,                 -- NULL when unknown
    price          REAL NOT NULL,           -- current list price, euros
    isbn           TEXT NOT NULL UNIQUE
);

CREATE TABLE customers (
    customer_id  INTEGER PRIMARY KEY,
    first_name   TEXT NOT NULL,
    last_name    TEXT NOT NULL,
    email        TEXT NOT NULL UNIQUE,
    phone        TEXT,                      -- NULL when not given
    city         TEXT NOT NULL,
    country      TEXT NOT NULL,
    signup_date  DATE NOT NULL,
    loyalty_tier TEXT                       -- 'Bronze', 'Silver', 'Gold'; NULL for non-members
);

CREATE TABLE orders (
    order_id     INTEGER PRIMARY KEY,
    customer_id  INTEGER NOT NULL REFERENCES customers (customer_id),
    channel      TEXT NOT NULL,             -- 'online' or 'in store'
    store_id     INTEGER REFERENCES stores (store_id),        -- NULL for online orders
    employee_id  INTEGER REFERENCES employees (employee_id),  -- the seller; NULL for online orders
    order_date   DATE NOT NULL,
    status       TEXT NOT NULL,             -- 'completed' (in store), 'processing', 'shipped', 'delivered', 'cancelled', 'returned'
    shipped_date DATE,                      -- NULL unless the order was shipped
    discount     REAL                       -- fraction off the whole order (0.1 = 10%); NULL when none
);

CREATE TABLE order_items (
    order_item_id INTEGER PRIMARY KEY,
    order_id      INTEGER NOT NULL REFERENCES orders (order_id),
    book_id       INTEGER NOT NULL REFERENCES books (book_id),
    quantity      INTEGER NOT NULL,
    unit_price    REAL NOT NULL             -- price paid per copy, before the order discount
);

CREATE TABLE reviews (
    review_id   INTEGER PRIMARY KEY,
    book_id     INTEGER NOT NULL REFERENCES books (book_id),
    customer_id INTEGER NOT NULL REFERENCES customers (customer_id),
    rating      INTEGER NOT NULL,           -- 1 to 5 stars
    review_date DATE NOT NULL,
    comment     TEXT                        -- NULL for rating-only reviews
);
