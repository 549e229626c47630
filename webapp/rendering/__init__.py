"""Pictures drawn from what the selectors answer (markup built in Python where a template would be slower to read
than the drawing code); the API and the pages serve them. Nothing here reads the database or the run folder."""
