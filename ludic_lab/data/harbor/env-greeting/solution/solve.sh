#!/bin/bash
printf '#!/bin/bash\necho "$GREETING, $1!"\n' > greet.sh
