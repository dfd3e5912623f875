/**
 * A table or column name for SQL text run through `sql.unsafe`. Names come
 * from resource declarations (checked to be plain identifiers), never from a
 * request; they are quoted anyway, so the text does not rely on that check.
 */
export const quoteIdentifier = (name: string): string => `"${name.replaceAll('"', '""')}"`
