"""Client library: consumer API, pull loop, dispatcher, checkpoint stores."""
